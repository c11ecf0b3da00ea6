package devicelimit

import (
	"slices"
	"testing"
	"time"
)

// writeLeases writes every lease asked as a store would, durable at
// once, and returns the keys written.
func writeLeases(tab *Table) []string {
	var keys []string
	gen, _ := tab.TakeLeases(func(key string, _ Lease) { keys = append(keys, key) })
	tab.LeasesDurable(gen)
	return keys
}

// A device leased at connect (lease of 1: 5 messages per 10 s) is
// admitted at its first and second publish without waiting for a lease
// write; without it, both wait (the control, same table).
func TestPreleaseFirstAdmissionsWaitForNothing(t *testing.T) {
	tab := newTable(t, 10)
	tab.EnableLeases(DefaultLeasePolicy)
	var q Quota
	q.NWindows = 2
	q.Windows[0] = Limit{Unit: Messages, N: 5, Window: 10 * time.Second}
	q.Windows[1] = Limit{Unit: Bytes, N: 10_000, Window: 10 * time.Second}
	now := t0

	gen := tab.PreleaseQuota("early", q, now)
	if gen == 0 || tab.WaitSessionLease(gen, 0) {
		t.Fatalf("Prelease gave batch %d, durable before its write: want one to wait for", gen)
	}
	if g := tab.PreleaseQuota("early", q, now); g != gen {
		t.Fatalf("a second Prelease before the write gave batch %d, want the first's %d: its leases are open but not durable", g, gen)
	}
	if keys := writeLeases(tab); len(keys) != 2 {
		t.Fatalf("leases written for %q, want the device's two windows", keys)
	}
	if !tab.WaitSessionLease(gen, 0) || tab.LeaseWaits() != 0 {
		t.Fatalf("after the write: batch %d not durable, or LeaseWaits %d (a session's wait is not an admission's)", gen, tab.LeaseWaits())
	}
	if g := tab.PreleaseQuota("early", q, now); g != 0 {
		t.Fatalf("a Prelease after the write gave batch %d, want 0: the leases are open and durable", g)
	}
	for i := range 2 {
		now = now.Add(5 * time.Second)
		if d := tab.AllowQuotaAt("early", q, 100, now); !d.Allowed || d.Lease != 0 {
			t.Fatalf("leased at connect, publish %d: %+v, want admitted with no lease to wait for", i+1, d)
		}
		writeLeases(tab) // the lazy write of the lease asked early
	}

	// The control: a device's first admission waits for its lease (it
	// covers the next admission too).
	now = now.Add(5 * time.Second)
	d := tab.AllowQuotaAt("late", q, 100, now)
	if !d.Allowed || d.Lease == 0 {
		t.Fatalf("first publish without a lease at connect: %+v, want admitted waiting for a lease", d)
	}
	if tab.WaitLease(d.Lease, 0) || tab.LeaseWaits() != 1 {
		t.Fatalf("the lease is durable before its write, or LeaseWaits = %d (want 1)", tab.LeaseWaits())
	}
	writeLeases(tab)
	if !tab.WaitLease(d.Lease, 0) || tab.LeaseWaits() != 1 {
		t.Fatalf("after the write: lease not durable, or LeaseWaits = %d (want 1)", tab.LeaseWaits())
	}
}

// A connect's lease that no publish uses closes like any idle lease:
// the collections hand out its window with a mark recording the whole
// lease (a crash after that charges nothing); until then Sweep keeps
// the empty window, then evicts it and the next collection deletes it.
func TestPreleaseUnusedClosesThenSwept(t *testing.T) {
	tab := newTable(t, 10)
	tab.EnableLeases(DefaultLeasePolicy)
	tab.lease.idleAfter = 3
	q := Quota{Limit: 100, Window: time.Second}
	if g := tab.PreleaseQuota("quiet", q, t0); g == 0 {
		t.Fatal("Prelease asked nothing")
	}
	writeLeases(tab)
	type handed struct {
		enc bool
		m   LeaseMark
	}
	collect := func() []handed {
		var hs []handed
		tab.CollectLeases(func(key string, enc []byte, m LeaseMark) {
			if key != "quiet" {
				t.Fatalf("collected %q", key)
			}
			hs = append(hs, handed{enc != nil, m})
		})
		return hs
	}
	later := t0.Add(time.Hour)
	for i := range 2 {
		if hs := collect(); len(hs) != 0 {
			t.Fatalf("collection %d handed out %+v while the lease is open and unused, want nothing", i+1, hs)
		}
		if n := tab.Sweep(later); n != 0 || tab.Len() != 1 {
			t.Fatalf("Sweep evicted %d (left %d) with the lease open, want the window kept", n, tab.Len())
		}
	}
	hs := collect()
	if len(hs) != 1 || !hs[0].enc || hs[0].m.Inc == 0 || hs[0].m.Recorded != 10 {
		t.Fatalf("third collection handed %+v, want the window with a mark recording its whole lease (10)", hs)
	}
	if n := tab.Sweep(later); n != 1 || tab.Len() != 0 {
		t.Fatalf("Sweep after the close evicted %d (left %d), want 1 (0)", n, tab.Len())
	}
	if hs := collect(); len(hs) != 1 || hs[0].enc || hs[0].m.Inc == 0 {
		t.Fatalf("collection after the eviction handed %+v, want the window's deletion with its incarnation", hs)
	}
}

// Nothing is leased at connect for a quota in shadow mode, for windows
// a decision would refuse, or without leases.
func TestPreleaseSkips(t *testing.T) {
	tab := newTable(t, 10)
	q := Quota{Limit: 10, Window: time.Second}
	if g := tab.PreleaseQuota("d", q, t0); g != 0 || tab.Len() != 0 {
		t.Fatalf("without leases: batch %d, %d windows, want none", g, tab.Len())
	}
	tab.EnableLeases(DefaultLeasePolicy)
	shadow := q
	shadow.Shadow = true
	if g := tab.PreleaseQuota("d", shadow, t0); g != 0 {
		t.Fatalf("shadow quota: batch %d, want 0", g)
	}
	if g := tab.Prelease("d", "", []Limit{{Unit: Messages, N: 0, Window: time.Second}}, t0); g != 0 {
		t.Fatalf("invalid limit: batch %d, want 0", g)
	}
	if g := tab.Prelease("d", "\x00refusals", []Limit{{Unit: Messages, N: 10, Window: time.Second}}, t0); g != 0 {
		t.Fatalf("a counter that is not quota: batch %d, want 0", g)
	}
	if keys := writeLeases(tab); len(keys) != 0 || tab.Len() != 0 {
		t.Fatalf("leases %q and %d windows, want none", keys, tab.Len())
	}
	// A class's windows are leased under their own keys.
	if g := tab.Prelease("d", "alarms", []Limit{{Unit: Messages, N: 10, Window: time.Second}}, t0); g == 0 {
		t.Fatal("class: asked nothing")
	}
	want := string(AppendWindowKey(nil, "d", "alarms", Messages, 0))
	if keys := writeLeases(tab); !slices.Equal(keys, []string{want}) {
		t.Fatalf("class lease written for %q, want %q", keys, want)
	}
}

// A window whose counts all expired while its lease is open is kept
// until the collections close the lease (then a crash charges it
// nothing); evicted before that, it left the store an open lease that
// any later crash charged.
func TestSweepKeepsOpenLeaseUntilClosed(t *testing.T) {
	tab := newTable(t, 10)
	tab.EnableLeases(DefaultLeasePolicy)
	tab.lease.idleAfter = 2
	q := Quota{Limit: 100, Window: time.Second}
	if d := tab.AllowAt("dev", q, t0); !d.Allowed {
		t.Fatalf("refused: %+v", d)
	}
	writeLeases(tab)
	later := t0.Add(time.Hour) // every count expired
	var marks []LeaseMark
	collect := func() {
		tab.CollectLeases(func(_ string, enc []byte, m LeaseMark) {
			if enc != nil {
				marks = append(marks, m)
			}
		})
	}
	collect() // writes the admission's window; the lease stays open
	for i := range 2 {
		if n := tab.Sweep(later); n != 0 {
			t.Fatalf("sweep %d evicted %d windows with their lease open, want 0", i+1, n)
		}
		collect()
	}
	if last := marks[len(marks)-1]; last.Inc == 0 || last.Recorded != 11 {
		t.Fatalf("marks %+v, want the last to record the whole lease (11: the admission and a lease of 10)", marks)
	}
	if n := tab.Sweep(later); n != 1 {
		t.Fatalf("sweep after the close evicted %d, want 1", n)
	}
}
