package persist

import (
	"context"
	"errors"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
)

// A reset is in the file when Snapshotter.Reset returns: after kill -9
// (the store copied, no final snapshot) the device's windows are empty
// and nothing is charged, although its lease writes held its counts and
// no snapshot ran since its admissions. A device not reset keeps its
// counts. With the table's Reset alone, the restart restored the reset
// device's counts from its lease write and charged its lease.
func TestResetDurable(t *testing.T) {
	s, tab, l, clock, sn := leasedStore(t, t.TempDir())
	q := devicelimit.Quota{Limit: 20, Window: time.Hour}
	admit := func(device string, n int) {
		for range n {
			clock.now = clock.now.Add(ms)
			d := tab.AllowAt(device, q, clock.now)
			if !d.Allowed || !tab.WaitLease(d.Lease, 5*time.Second) {
				t.Fatalf("%s: admission %+v", device, d)
			}
		}
	}
	admit("dev", 20)
	admit("other", 5)
	had, err := sn.Reset("dev")
	if err != nil || !had {
		t.Fatalf("Reset = %v, %v; want true, nil", had, err)
	}
	if had, err := sn.Reset("never"); err != nil || had {
		t.Fatalf("Reset of a device without a window = %v, %v; want false, nil", had, err)
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	at := clock.now.Add(time.Second)
	_, tab2, charged := afterCrash(t, s, tenthLease, at)
	if got := tab2.PeekAt("dev", q, at).Count; got != 0 {
		t.Errorf("after the reset and a crash dev counts %d, want 0", got)
	}
	if got := tab2.PeekAt("other", q, at).Count; got < 5 {
		t.Errorf("after the crash other counts %d, want its 5 and at most a lease more", got)
	}
	if charged > 1 {
		t.Errorf("charged %d windows, want at most other's: the reset closed dev's lease", charged)
	}
}

// A deletion merged before a lease write of the same incarnation that
// was taken before it (the lease write's transaction came second) keeps
// the lease closed: the settle neither restores the write's counts nor
// charges the window.
func TestMergeLeaseWriteAfterDeletion(t *testing.T) {
	s := open(t, t.TempDir())
	counts := make([]uint32, 11) // newTable's 10 buckets and one
	counts[9], counts[10] = 4, 2
	win, err := devicelimit.Window{Length: time.Hour, Head: 10, Counts: counts}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		l   leaseRecord
		how int
	}{
		{leaseRecord{inc: 3, rec: 8}, leaseWindow},                                        // incarnation 3 deleted, its leases holding 8
		{leaseRecord{inc: 3, cap: 8, length: time.Hour, adm: 6, window: win}, leaseWrite}, // late
	} {
		if err := s.update(func(tx *bolt.Tx) error { return mergeLease(tx, "dev", w.l, w.how) }); err != nil {
			t.Fatal(err)
		}
	}
	settledClosed(t, s)
}

// settledClosed settles the leases of s and checks that "dev", whose
// lease the deletion closed, is neither restored nor charged, and that
// the settle emptied the leases.
func settledClosed(t *testing.T, s *Store) {
	t.Helper()
	tab := newTable(t, 10)
	tab.EnableLeases(devicelimit.DefaultLeasePolicy)
	now := devicelimit.Tick(time.Hour)
	charged, err := s.SettleLeases(tab, true, now, now)
	if err != nil {
		t.Fatal(err)
	}
	if got := tab.PeekAt("dev", devicelimit.Quota{Limit: 20, Window: time.Hour}, now).Count; got != 0 || charged != 0 {
		t.Errorf("settled: dev counts %d, %d windows charged; want 0, 0", got, charged)
	}
	if b := dumpLeases(t, s); b != "" {
		t.Errorf("the settle left lease records:\n%s", b)
	}
}

// afterCrash starts on a copy of s as after kill -9 (no final snapshot)
// at tick at: the windows restored into a table with leases of policy,
// the leases settled. It returns the store, the table and how many
// windows were charged.
func afterCrash(t *testing.T, s *Store, policy devicelimit.LeasePolicy, at devicelimit.Tick) (*Store, *devicelimit.Table, int) {
	t.Helper()
	s2 := open(t, copyStore(t, s))
	tab := newTable(t, 10)
	tab.EnableLeases(policy)
	if _, err := s2.RestoreWindows(tab); err != nil {
		t.Fatal(err)
	}
	charged, err := s2.SettleLeases(tab, true, at, at)
	if err != nil {
		t.Fatal(err)
	}
	return s2, tab, charged
}

// tenthLease is the default lease policy: a tenth of the quota, 1 to
// 1000 units.
var tenthLease = devicelimit.LeasePolicy{Share: 0.1, Min: 1, Max: 1000}

// leasedStore opens a store in dir and returns it with a table of 10
// buckets and leases of tenthLease, its Leaser, and a Snapshotter every
// hour (Snapshot takes one) on a clock at t0 that the test steps.
func leasedStore(t *testing.T, dir string) (*Store, *devicelimit.Table, *Leaser, *stepClock, *Snapshotter) {
	t.Helper()
	s := open(t, dir)
	tab := newTable(t, 10)
	tab.EnableLeases(tenthLease)
	clock := &stepClock{now: t0}
	return s, tab, NewLeaser(s, tab, nil), clock, NewSnapshotter(s, tab, clock, time.Hour, nil)
}

// A reset that comes after Close (the gateway stopping, its final
// snapshot taken) changes nothing, in memory or on disk, and says so:
// no later snapshot would write it.
func TestResetAfterClose(t *testing.T) {
	_, tab, l, clock, sn := leasedStore(t, t.TempDir())
	q := devicelimit.Quota{Limit: 20, Window: time.Hour}
	clock.now = clock.now.Add(ms)
	if d := tab.AllowAt("dev", q, clock.now); !d.Allowed || !tab.WaitLease(d.Lease, 5*time.Second) {
		t.Fatalf("admission %+v", d)
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := sn.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	had, err := sn.Reset("dev")
	if !errors.Is(err, ErrClosed) || had {
		t.Fatalf("Reset after Close = %v, %v; want false, ErrClosed", had, err)
	}
	if got := tab.PeekAt("dev", q, clock.now).Count; got != 1 {
		t.Errorf("after a refused reset dev counts %d in memory, want its 1", got)
	}
}
