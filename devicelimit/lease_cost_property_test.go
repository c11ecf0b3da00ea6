package devicelimit

import (
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// leaseCostSequences is how many random histories
// TestPropertyCrashCostsAtMostALease runs.
const leaseCostSequences = 5_000

// TestPropertyCrashCostsAtMostALease compares a table that crashes with
// one that does not, on the same arrivals: a device publishing at random
// instants, often near or above its quota, lease writes (some failing),
// snapshots (some cut off by the crash) and up to three crashes at
// random instants, each restarted at a random instant after it and
// charged at a random bound of the crash instant no earlier than it (as
// the gateway's high-water plus two intervals is). Before the first
// crash both decide alike; after it, the crashing table never admits
// more than one lease per crash fewer than the reference, at any point
// of the history, whatever the device's rate.
func TestPropertyCrashCostsAtMostALease(t *testing.T) {
	forEachSeq(t, 39, leaseCostSequences/raceScale, func(seq int, r *rand.Rand) {
		crashCostSequence(t, seq, r, nil)
	})
}

// crashCostSequence runs one random history of
// TestPropertyCrashCostsAtMostALease, writing its events to trace
// unless nil.
func crashCostSequence(t *testing.T, seq int, r *rand.Rand, trace io.Writer) {
	buckets := 1 + r.IntN(20)
	policy := LeasePolicy{Share: []float64{0.05, 0.1, 0.2, 0.5}[r.IntN(4)], Min: 1 + r.IntN(2), Max: 2 + r.IntN(20)}
	l := Limit{Unit: Messages, N: 1 + r.IntN(40), Window: time.Duration(1+r.IntN(4)) * time.Second}
	q := Quota{Limit: l.N, Window: l.Window}
	lease := policy.Size(l, 1)
	ref, err := NewTable(buckets)
	if err != nil {
		t.Fatal(err)
	}
	w := &leaseWorld{t: t, r: r, buckets: buckets, idleAfter: uint32(1 + r.IntN(3)), policy: policy,
		st: leaseStore{windows: map[string][]byte{}, leases: map[string]storedLease{}}, now: t0, trace: trace}
	w.newTable()
	// The device's rate: its mean gap between publishes is from a
	// fifth to twice the quota's (T/N).
	gap := time.Duration(float64(l.Window) / float64(l.N) * (0.2 + 1.8*r.Float64()))
	if w.trace != nil {
		w.tracef("history: buckets %d policy %+v quota %v gap %v", buckets, policy, l, gap)
	}
	crashes, refAdmitted, admitted := 0, 0, 0
	var history []string
	for range 50 + r.IntN(300) {
		switch op := r.IntN(100); {
		case op < 70:
			w.now = w.now.Add(time.Duration(r.Int64N(int64(2*gap) + 1)))
			dr, dc := ref.AllowAt("d", q, w.now), w.tab.AllowAt("d", q, w.now)
			if w.trace != nil {
				w.tracef("publish at %v: reference %+v, crashing %+v", w.now.Sub(t0), dr, dc)
			}
			if crashes == 0 && dr.Allowed != dc.Allowed {
				t.Fatalf("seq %d: before any crash the reference decided %v and the leased table %v at %v", seq, dr.Allowed, dc.Allowed, w.now)
			}
			if crashes > 0 {
				refAdmitted += b2i(dr.Allowed)
				admitted += b2i(dc.Allowed)
			}
			history = append(history, "publish")
			if refAdmitted-admitted > crashes*lease {
				t.Fatalf("seq %d: after %d crashes the reference admitted %d and the crashing table %d: more than %d (a lease of %d per crash) fewer; quota %v, %d buckets, policy %+v, mean gap %v; %v",
					seq, crashes, refAdmitted, admitted, crashes*lease, lease, l, buckets, policy, gap, history)
			}
		case op < 80:
			w.writeLeases(r.IntN(8) != 0)
			history = append(history, "lease write")
		case op < 88:
			w.snapshot(-1)
			history = append(history, "snapshot")
		case op < 90 && crashes < 3:
			kind := r.IntN(3)
			switch kind {
			case 0:
				w.snapshot(r.IntN(2)) // a crash during a snapshot
			case 1:
				w.tab.TakeLeases(func(string, Lease) {}) // during a lease write
			}
			down := time.Duration(r.Int64N(int64(1500 * time.Millisecond)))
			bound := w.now.Add(time.Duration(r.Int64N(int64(2 * time.Second))))
			w.restart(down, bound)
			crashes++
			history = append(history, "crash", "restart after "+down.String())
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// restart loses the table and starts again after down as the gateway
// does: restore, settle every stored lease charged at bound (no earlier
// than the crash), write the charged windows, clear the leases.
func (w *leaseWorld) restart(down time.Duration, bound Tick) {
	w.pending = w.pending[:0]
	w.now = w.now.Add(down)
	if w.trace != nil {
		w.tracef("restart at %v", w.now.Sub(t0))
	}
	w.newTable()
	for _, key := range slices.Sorted(maps.Keys(w.st.windows)) {
		if err := w.tab.RestoreBinary(key, w.st.windows[key]); err != nil {
			w.t.Fatal(err)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(w.st.leases)) {
		changed, units, err := w.tab.SettleLease(key, w.st.leases[key].stored(), bound, w.now)
		if err != nil {
			w.t.Fatal(err)
		}
		if w.trace != nil {
			w.tracef("settled %q at %v: changed %v charged %d", key, bound.Sub(t0), changed, units)
		}
		if changed {
			if win, ok := w.tab.Snapshot(key); ok {
				w.st.windows[key], _ = win.MarshalBinary()
			} else {
				delete(w.st.windows, key)
			}
		}
	}
	clear(w.st.leases)
}

// A refusal the crash charge alone causes is told apart (ChargedAt):
// the device at 9 of 10 per second is charged a lease of 2 by a crash;
// its refusal while the charge is in its window is the charge's, one
// it would get without the charge is not, and once the charge has left
// the window no refusal is.
func TestChargedAtTellsTheChargesRefusals(t *testing.T) {
	tab := newTable(t, 10)
	tab.EnableLeases(LeasePolicy{Share: 0.2, Min: 1, Max: 10})
	q := Quota{Limit: 10, Window: time.Second}
	now := t0
	for range 9 {
		now = now.Add(100 * time.Millisecond)
		if !tab.AllowAt("d", q, now).Allowed {
			t.Fatal("refused under the quota")
		}
	}
	_, units, err := tab.SettleLease("d", StoredLease{Inc: 1, Cap: 11, Recorded: 9, Length: time.Second}, now.Add(time.Hour), now)
	if err != nil || units != 2 {
		t.Fatalf("charged %d, %v; want 2", units, err)
	}
	if d := tab.AllowAt("d", q, now); d.Allowed {
		t.Fatalf("admitted at 9+2 of 10: %+v", d)
	}
	if !tab.ChargedAt("d", "", q, 0, now) {
		t.Error("a refusal at 9 used and 2 charged of 10 is not told as the charge's")
	}
	if tab.ChargedAt("other", "", q, 0, now) {
		t.Error("a device without a window told as charged")
	}
	// Without leases nothing is charged.
	plain := newTable(t, 10)
	if plain.ChargedAt("d", "", q, 0, now) {
		t.Error("a table without leases told a charge")
	}
	// Full without the charge: 10 admitted in another window.
	tab2 := newTable(t, 10)
	tab2.EnableLeases(LeasePolicy{Share: 0.2, Min: 1, Max: 10})
	for i := range 10 {
		if !tab2.AllowAt("d", q, t0.Add(time.Duration(i)*10*time.Millisecond)).Allowed {
			t.Fatal("refused under the quota")
		}
	}
	at := t0.Add(100 * time.Millisecond)
	if _, _, err := tab2.SettleLease("d", StoredLease{Inc: 1, Cap: 12, Recorded: 10, Length: time.Second}, at, at); err != nil {
		t.Fatal(err)
	}
	if tab2.ChargedAt("d", "", q, 0, at) {
		t.Error("a refusal of a device at its quota without the charge told as the charge's")
	}
	// The charge gone from the window (a second later): not the charge's.
	later := now.Add(1100 * time.Millisecond)
	for range 10 {
		tab.AllowAt("d", q, later)
	}
	if tab.ChargedAt("d", "", q, 0, later) {
		t.Error("a refusal after the charge left the window told as the charge's")
	}
}

// A lease whose last possible admission is out of every window reaching
// the restart charges nothing: no window is made, none to write, and
// the settle says so.
func TestSettleLeaseLongAgoChargesNothing(t *testing.T) {
	tab := newTable(t, 10)
	tab.EnableLeases(DefaultLeasePolicy)
	now := t0.Add(time.Hour)
	changed, units, err := tab.SettleLease("d", StoredLease{Inc: 1, Cap: 11, Recorded: 2, Length: time.Second}, t0, now)
	if err != nil || changed || units != 0 {
		t.Fatalf("settle an hour after a 1 s window's last admission: changed %v, charged %d, %v; want nothing", changed, units, err)
	}
	if n := tab.Len(); n != 0 {
		t.Errorf("the table holds %d windows, want none", n)
	}
	// Within reach, the same lease charges its 9.
	if _, units, err := tab.SettleLease("d", StoredLease{Inc: 1, Cap: 11, Recorded: 2, Length: time.Second}, now, now); err != nil || units != 9 {
		t.Errorf("settle at the restart: charged %d, %v; want 9", units, err)
	}
}
