package cluster

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// TestScriptAcrossGateways is the invariant's property test in the
// conditions that only shared windows meet: decisions on one device
// from gateways with different bucket counts, a Redis clock that steps
// back, quota windows changed mid-sequence (re-cuts), limits that need
// 1- or 2-byte counters. Admissions are placed at the script's own
// clock (the record's high-water, read back after each admission): no
// interval of T may hold more than N of them, per quota. Every refusal's
// RetryAfter must be exact: a microsecond earlier the window is still
// full, at that instant it has room (as long as nothing else happens).
func TestScriptAcrossGateways(t *testing.T) {
	srv := redistest.Start(t)
	r := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	rc := srv.Client()
	lims := map[int]*Limiter{}
	refusals := 0
	for seq := range 60 {
		bs := []int{1 + r.IntN(30), 1 + r.IntN(30)}
		for _, b := range bs {
			if lims[b] == nil {
				lims[b], _ = newLimiter(t, srv, b, PolicyFailClosed, time.Second)
			}
		}
		window := func() time.Duration { return time.Duration(100+r.IntN(5000)) * time.Millisecond }
		q := devicelimit.Quota{Limit: []int{1 + r.IntN(20), 1 + r.IntN(3), 260 + r.IntN(10)}[r.IntN(3)], Window: window()}
		dev := fmt.Sprint("gw-", seq)
		now := int64(t0)/1000 + r.Int64N(1e6)
		var admitted []devicelimit.Tick
		from := 0  // admissions under the current quota start here
		since := 0 // and since the last lengthening of the window
		for range 300 {
			T := int64(q.Window / time.Microsecond)
			switch r.IntN(5) {
			case 0:
				now += r.Int64N(T)
			case 1:
				now -= r.Int64N(T) // Redis's clock stepped back
			default:
				now += r.Int64N(T / 20)
			}
			if r.IntN(40) == 0 { // a quota change re-cuts the window
				checkWindows(t, admitted[from:], q, fmt.Sprintf("seq %d buckets %v before a re-cut", seq, bs))
				from = len(admitted)
				if w := window(); w > q.Window {
					// Counts that expired under the shorter window are gone.
					since, q.Window = from, w
				} else {
					q.Window = w
				}
			}
			l := lims[bs[r.IntN(2)]]
			clock := now // the script's clock: now, or the window's high-water
			if rec, err := rc.Get(ctx, l.windowKey(dev)).Bytes(); err == nil {
				clock = max(clock, int64(binary.LittleEndian.Uint64(rec[8:16])))
			}
			d, err := l.evalAt(ctx, dev, q, true, now)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				// The quota in force holds at once, the admissions
				// before a shortening of the window included: at most N
				// in the T up to this one.
				at := devicelimit.Tick(clock * 1000)
				n := 1
				for i := len(admitted) - 1; i >= since && at.Sub(admitted[i]) < q.Window; i-- {
					n++
				}
				if n > q.Limit {
					t.Fatalf("seq %d buckets %v quota %v: admission %d at %d makes %d within T", seq, bs, q, len(admitted), clock, n)
				}
				admitted = append(admitted, at)
				continue
			}
			refusals++
			at := clock + d.RetryAfter.Microseconds()
			early, err1 := l.evalAt(ctx, dev, q, false, at-1)
			onTime, err2 := l.evalAt(ctx, dev, q, false, at)
			if err1 != nil || err2 != nil || d.RetryAfter <= 0 || early.Remaining != 0 || onTime.Remaining == 0 {
				t.Fatalf("seq %d buckets %v quota %v: refusal %+v at %d (clock %d); a microsecond before: %+v; at: %+v (%v, %v)",
					seq, bs, q, d, now, clock, early, onTime, err1, err2)
			}
		}
		checkWindows(t, admitted[from:], q, fmt.Sprintf("seq %d buckets %v", seq, bs))
	}
	t.Logf("invariant held; %d refusals, each RetryAfter exact", refusals)
}
