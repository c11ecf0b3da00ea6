package admin

import (
	"testing"
	"time"
)

// TestForwardHistory: each sample adds the messages delivered and moved
// to the dead letters since the one before (the first only sets the
// counters) and raises its minute's peak backlog; a counter that went
// back (a restart of its source) adds nothing; a destination not yet
// sampled has no spans.
func TestForwardHistory(t *testing.T) {
	var f fwdHistory
	at := t0
	sample := func(forwarded uint64, backlog int64, dead uint64) {
		f.tick(at, []ForwardStats{{Upstream: "cloud", Forwarded: forwarded, Backlog: backlog, DeadByReason: map[string]uint64{"not_authorized": dead}}})
		at = at.Add(RateInterval)
	}
	sample(100, 5, 1) // the counters from before: not counted
	sample(130, 40, 1)
	sample(150, 20, 4)
	sample(10, 0, 4) // went back
	got := f.list(at, []string{"cloud", "other"})
	if len(got) != 2 || len(got[0].Spans) != 2 || len(got[1].Spans) != 0 {
		t.Fatalf("history: %+v", got)
	}
	m := got[0].Spans[0]
	last := len(m.Delivered) - 1
	if m.StepSeconds != 60 || len(m.Delivered) != 60 || m.Delivered[last] != 50 || m.Backlog[last] != 40 || m.Dead[last] != 3 {
		t.Fatalf("the minute now: delivered %d, backlog %d, dead %d (step %d, %d slots); want 50, 40, 3",
			m.Delivered[last], m.Backlog[last], m.Dead[last], m.StepSeconds, len(m.Delivered))
	}
	h := got[0].Spans[1]
	if h.StepSeconds != 3600 || len(h.Delivered) != 24 || h.Delivered[23] != 50 {
		t.Fatalf("the hour now: %+v", h)
	}
	// An hour later the minutes have gone by, the hours not all.
	at = at.Add(time.Hour)
	sample(10, 0, 4)
	m = f.list(at, []string{"cloud"})[0].Spans[0]
	for i, v := range m.Delivered {
		if v != 0 {
			t.Fatalf("an hour later, minute %d holds %d", i, v)
		}
	}
}
