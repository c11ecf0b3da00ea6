package devicelimit

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// crashRun plays arrivals of one device against a table that is
// snapshotted every interval and crashes at random moments: what was
// admitted after the last snapshot is lost to the table but was
// delivered, so it counts in the result. A restarted table restores the
// last snapshot and, with charge set, is charged at the latest instant
// the lost admissions could have: the last snapshot plus two intervals,
// which may be after the restart.
// It returns every admission, lost ones included, and the crashes.
func crashRun(t *testing.T, r *rand.Rand, q Quota, buckets int, charge bool) ([]Tick, int) {
	t.Helper()
	const dev = "dev"
	tab := newTable(t, buckets)
	interval := q.Window/50 + time.Duration(r.Int64N(int64(2*q.Window)))
	var (
		admitted []Tick
		saved    Window
		haveSave bool
		savedAt  Tick
		crashes  int
	)
	arr := arrivals(r, q, buckets)
	savedAt = arr[0] // the first start records the clock
	nextSnap := arr[0].Add(interval)
	down := Tick(0) // arrivals before this tick find the gateway down
	for i, at := range arr {
		for nextSnap <= at {
			saved, haveSave = tab.Snapshot(dev)
			savedAt = nextSnap
			nextSnap = nextSnap.Add(interval)
		}
		if at < down {
			continue
		}
		if d := tab.AllowAt(dev, q, at); d.Allowed {
			admitted = append(admitted, at)
		}
		if r.IntN(40) != 0 || i+1 == len(arr) {
			continue
		}
		// A crash between this arrival and the next (and before the
		// next snapshot), a restart after a random downtime.
		crash := at + Tick(r.Int64N(int64(min(arr[i+1], nextSnap)-at)+1))
		restart := crash.Add(time.Duration(r.Int64N(int64(2 * q.Window))))
		if r.IntN(3) == 0 {
			restart = crash // restarted at once
		}
		crashes++
		tab = newTable(t, buckets)
		if haveSave {
			if err := tab.Restore(dev, saved); err != nil {
				t.Fatal(err)
			}
		}
		if charge {
			tab.SetCrashCharge(savedAt.Add(2 * interval))
		}
		// Snapshots go on from the restart, and the start itself
		// records the clock (the store's MarkRunning): a crash before
		// the first snapshot is charged from the restart.
		down = restart
		nextSnap = restart.Add(interval)
		savedAt = restart
	}
	return admitted, crashes
}

// TestPropertyCrashChargeKeepsInvariant: across crashes at random moments
// (several per sequence, some restarted at once), the admissions of all
// runs together, those the crashes made the table forget included, never
// exceed N in any interval of T when the restarted table carries the
// crash charge. Without the charge the same runs break the invariant
// (checked too, so the test can fail).
func TestPropertyCrashChargeKeepsInvariant(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 17))
	violations, runs, crashes := 0, 3000, 0
	for seq := range runs {
		q, buckets := randomQuota(r)
		state := *r // the same sequence with and without the charge
		admitted, n := crashRun(t, r, q, buckets, true)
		crashes += n
		checkWindows(t, admitted, q, fmt.Sprintf("seq %d buckets %d, charged", seq, buckets))
		without, _ := crashRun(t, &state, q, buckets, false)
		for i := q.Limit; i < len(without); i++ {
			if without[i].Sub(without[i-q.Limit]) <= q.Window {
				violations++
				break
			}
		}
	}
	t.Logf("%d sequences, %d crashes; without the charge %d sequences broke the invariant", runs, crashes, violations)
	if violations == 0 {
		t.Fatal("no sequence broke the invariant without the charge: the test cannot tell")
	}
}

// TestCrashChargeSteps: at fixed instants, a restored window and a device
// without one are charged to their limit at the charge tick, refused until
// its bucket leaves the window, and a window already past the charge is
// not charged.
func TestCrashChargeSteps(t *testing.T) {
	q := Quota{Limit: 5, Window: 10 * time.Second}
	tab := newTable(t, 10)
	tab.AllowAt("restored", q, t0)
	tab.AllowAt("restored", q, t0)
	at := t0.Add(time.Second)
	tab.SetCrashCharge(at)
	now := t0.Add(1500 * ms)
	// PeekAt of a device without a window: full until at's bucket (1 s
	// wide, [1 s, 2 s)) leaves the window at 12 s.
	if d := tab.PeekAt("new", q, now); d.Remaining != 0 || d.Count != 5 || d.RetryAfter != 10500*ms {
		t.Fatalf("peek without a window: %+v, want full, retry after 10.5s", d)
	}
	for _, dev := range []string{"restored", "new"} {
		if d := tab.AllowAt(dev, q, now); d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("%s right after the charge: %+v, want refused", dev, d)
		}
	}
	// The restored window held 2, so it was charged 3: when its own 2
	// leave at 11 s, 2 more are admitted, not 3, until the charge leaves
	// at 12 s.
	for i, want := range []bool{true, true, false} {
		if d := tab.AllowAt("restored", q, t0.Add(11*time.Second)); d.Allowed != want {
			t.Fatalf("restored at 11s, message %d: %+v, want allowed %v (charged 3 until 12s)", i, d, want)
		}
	}
	if d := tab.AllowAt("new", q, t0.Add(12*time.Second)); !d.Allowed {
		t.Fatalf("new at 12s: %+v, want admitted", d)
	}
	// A device first seen after the charge has left its window.
	if d := tab.AllowAt("late", q, t0.Add(13*time.Second)); !d.Allowed || d.Count != 1 {
		t.Fatalf("late device: %+v, want admitted as its first", d)
	}
	// The charge is not written as a flag in snapshots, and is counted.
	w, _ := tab.Snapshot("new")
	if w.Total() != 1 {
		t.Fatalf("new after 12s holds %d, want 1 (the charge expired)", w.Total())
	}
}
