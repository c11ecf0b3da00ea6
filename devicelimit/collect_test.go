package devicelimit

import (
	"fmt"
	"testing"
	"time"
)

type collected struct {
	device string
	enc    []byte // nil: delete
}

func collect(tab *Table) []collected {
	var out []collected
	tab.Collect(func(device string, enc []byte) {
		var c []byte
		if enc != nil {
			c = append([]byte{}, enc...)
		}
		out = append(out, collected{device, c})
	})
	return out
}

func TestCollectHandsOutChangesOnce(t *testing.T) {
	tab := newTable(t, 4)
	q := Quota{Limit: 2, Window: 100 * ms}
	tab.AllowAt("a", q, t0)
	tab.AllowAt("a", q, t0)
	tab.AllowAt("a", q, t0) // refused: no change
	tab.AllowAt("b", q, t0)
	got := collect(tab)
	if len(got) != 2 {
		t.Fatalf("first collect: %d entries, want 2 (a, b): %+v", len(got), got)
	}
	for _, c := range got {
		want, _ := tab.Snapshot(c.device)
		var w Window
		if err := w.UnmarshalBinary(c.enc); err != nil || w.Total() != want.Total() || w.Head != want.Head {
			t.Fatalf("%s: collected %+v (%v), table has %+v", c.device, w, err, want)
		}
	}
	if got := collect(tab); len(got) != 0 {
		t.Fatalf("second collect with no change: %+v", got)
	}
	// A refusal changes nothing; an admission makes the window dirty.
	tab.AllowAt("a", q, t0.Add(ms))
	tab.AllowAt("b", q, t0.Add(ms))
	if got := collect(tab); len(got) != 1 || got[0].device != "b" {
		t.Fatalf("after one admission: %+v, want b", got)
	}
	// Eviction and reset of stored windows become deletions.
	tab.Reset("a")
	tab.Sweep(t0.Add(time.Second))
	got = collect(tab)
	if len(got) != 2 || got[0].enc != nil || got[1].enc != nil {
		t.Fatalf("after reset and sweep: %+v, want two deletions", got)
	}
	// A window never handed out is dropped without a deletion.
	tab.AllowAt("c", q, t0.Add(time.Second))
	tab.Reset("c")
	if got := collect(tab); len(got) != 0 {
		t.Fatalf("never stored, reset: %+v", got)
	}
}

func TestCollectEvictedThenBackAgain(t *testing.T) {
	tab := newTable(t, 4)
	q := Quota{Limit: 2, Window: 100 * ms}
	tab.AllowAt("a", q, t0)
	collect(tab)
	tab.AllowAt("a", q, t0.Add(ms))   // dirty, listed
	tab.Reset("a")                    // gone
	tab.AllowAt("a", q, t0.Add(2*ms)) // dirty again, listed again
	got := collect(tab)
	if len(got) != 2 || got[0].enc != nil || got[1].enc == nil {
		t.Fatalf("got %+v, want a deletion then one window", got)
	}
	var w Window
	if err := w.UnmarshalBinary(got[1].enc); err != nil || w.Total() != 1 {
		t.Fatalf("window %+v, %v; want the new count only", w, err)
	}
}

func TestRestoreBinaryMatchesRestore(t *testing.T) {
	src := newTable(t, 4)
	q := Quota{Limit: 5, Window: 100 * ms}
	for _, at := range []time.Duration{0, 30 * ms, 30 * ms, 80 * ms} {
		src.AllowAt("dev", q, t0.Add(at))
	}
	got := collect(src)
	dst := newTable(t, 4)
	if err := dst.RestoreBinary("dev", got[0].enc); err != nil {
		t.Fatal(err)
	}
	if err := dst.RestoreBinary("bad", []byte{1, 2, 3}); err == nil {
		t.Fatal("RestoreBinary accepted garbage")
	}
	if len(collect(dst)) != 0 {
		t.Fatal("restored windows should not be dirty")
	}
	for _, at := range []time.Duration{100 * ms, 110 * ms, 130 * ms, 200 * ms} {
		a, b := src.AllowAt("dev", q, t0.Add(at)), dst.AllowAt("dev", q, t0.Add(at))
		if a != b {
			t.Fatalf("at +%v: original %+v, restored %+v", at, a, b)
		}
	}
	// Restored windows are stored: their eviction is a deletion.
	dst.Reset("dev")
	if got := collect(dst); len(got) != 1 || got[0].enc != nil {
		t.Fatalf("reset of a restored window: %+v, want a deletion", got)
	}
}

func TestWallClockStepChangesNoDecision(t *testing.T) {
	src := NewManualTime(t0.Time())
	clk := NewSystemClockOn(src, 0)
	tab := newTable(t, 4)
	q := Quota{Limit: 2, Window: 100 * ms}
	for i := 0; i < 2; i++ {
		tab.AllowAt("dev", q, clk.Now())
	}
	src.Advance(50 * ms)
	src.StepWall(-time.Hour) // NTP or `date` sets the clock back
	if d := tab.AllowAt("dev", q, clk.Now()); d.Allowed || d.RetryAfter != 75*ms {
		t.Fatalf("after a wall step back: %+v, want refused with RetryAfter 75ms as without the step", d)
	}
	src.StepWall(+2 * time.Hour) // and forward
	if d := tab.AllowAt("dev", q, clk.Now()); d.Allowed || d.RetryAfter != 75*ms {
		t.Fatalf("after a wall step forward: %+v, want refused with RetryAfter 75ms", d)
	}
	src.Advance(75 * ms)
	if d := tab.AllowAt("dev", q, clk.Now()); !d.Allowed {
		t.Fatalf("after the window passed: %+v, want admitted", d)
	}
	if clk.Now().Sub(t0) != 125*ms {
		t.Fatalf("logical clock at +%v, want +125ms of elapsed time", clk.Now().Sub(t0))
	}
}

// A table nobody collects (a log or connect-rate limiter) keeps no list
// of changed devices, however many come and go; the first Collect still
// hands out every window that gained a count before it, and later ones
// only what changed since.
func TestUncollectedTableKeepsNoChangeList(t *testing.T) {
	tab := newTable(t, 1)
	q := Quota{Limit: 5, Window: 10 * ms}
	for round := range 5 {
		for i := range 1000 {
			tab.AllowAt(fmt.Sprint("dev-", i), q, t0.Add(time.Duration(round)*time.Second))
		}
		tab.Sweep(t0.Add(time.Duration(round)*time.Second + time.Second))
	}
	if n := tab.Dirty(); n != 0 {
		t.Fatalf("a table never collected lists %d changes, want 0", n)
	}
	now := t0.Add(10 * time.Second)
	tab.AllowAt("a", q, now)
	tab.AllowAt("b", q, now)
	if got := collect(tab); len(got) != 2 {
		t.Fatalf("first Collect handed out %d windows, want the 2 live ones: %+v", len(got), got)
	}
	tab.AllowAt("a", q, now)
	if got := collect(tab); len(got) != 1 || got[0].device != "a" {
		t.Fatalf("second Collect handed out %+v, want only a", got)
	}
	if got := collect(tab); len(got) != 0 {
		t.Fatalf("third Collect handed out %+v, want nothing", got)
	}
}
