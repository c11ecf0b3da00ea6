package cluster

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestRecentNeverMisses: a recent count's sum at any instant holds every
// count added within the last span (it may hold older ones), against a
// list of what was added, over random gaps, drops of copies taken along
// the way (checkpoints), and spans that change (each followed by a
// checkpoint, as Owner.decide voids the lease then: before, a longer
// span missed what the shorter one had let go of).
func TestRecentNeverMisses(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	type add struct {
		at devicelimit.Tick
		v  int64
	}
	var r recent
	var live []add // added since the last drop
	span := 10 * time.Second
	now := t0
	for step := range 20000 {
		now = now.Add(time.Duration(rng.Int64N(int64(3 * time.Second))))
		if rng.IntN(500) == 0 {
			span = time.Duration(1+rng.IntN(30)) * time.Second
			if r.respanned(span) {
				// The owner voids the lease: a checkpoint of everything
				// so far lands before the next admission.
				r.advance(now, span)
				old := r
				r.drop(&old)
				live = live[:0]
			}
		}
		v := int64(1 + rng.IntN(5))
		r.add(now, span, v)
		live = append(live, add{now, v})
		if rng.IntN(50) == 0 { // a checkpoint of everything so far lands
			old := r
			r.drop(&old)
			live = live[:0]
		}
		var want, most int64
		for _, a := range live {
			if now.Sub(a.at) < span {
				want += a.v
			}
			most += a.v
		}
		if got := r.sum(now, span); got < want || got > most {
			t.Fatalf("step %d: sum %d, want at least %d (added within the span) and at most %d (added since the drop); span %s, %+v", step, got, want, most, span, r)
		}
	}
}
