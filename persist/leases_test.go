package persist

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
)

// A crash with leases, on a real file: a device that published past its
// last snapshot is charged what its lease could still have admitted, no
// more than a lease; one idle since a snapshot closed its lease is
// charged nothing, and one never seen has no window. The leases are
// gone after the start, and the charge is in the file.
func TestLeasesChargeOnlyOpenLeases(t *testing.T) {
	s, tab, l, clock, sn := leasedStore(t, t.TempDir())
	policy := tenthLease
	daily := devicelimit.Quota{Limit: 1000, Window: 24 * time.Hour}

	admit := func(device string, n int) {
		for range n {
			clock.now = clock.now.Add(ms)
			d := tab.AllowAt(device, daily, clock.now)
			if !d.Allowed {
				t.Fatalf("%s refused: %+v", device, d)
			}
			if !tab.WaitLease(d.Lease, 5*time.Second) {
				t.Fatalf("%s: lease %d not durable", device, d.Lease)
			}
		}
	}
	admit("idle", 3)
	admit("busy", 150)
	// The 49th closes idle's lease: nothing since the first, and two
	// lengths of its window are 48 collections of an hour (the
	// Snapshotter's interval, devicelimit/lease.go's idleLimit).
	for range 49 {
		if _, err := sn.Snapshot(); err != nil {
			t.Fatal(err)
		}
		admit("busy", 1)
	}
	admit("busy", 20) // past the last snapshot
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	at := clock.now.Add(time.Second)
	s2, tab2, n := afterCrash(t, s, policy, at) // kill -9: no final snapshot
	if n != 1 {
		t.Errorf("charged %d windows, want 1 (busy's)", n)
	}
	used := func(tab *devicelimit.Table, device string) int {
		return tab.PeekAt(device, daily, at).Count
	}
	// busy: 198 recorded by the last snapshot, 21 after; its lease
	// (100) was renewed when it ran low, so the charge covers the 21
	// and costs it at most one lease beyond its 219.
	if got := used(tab2, "busy"); got < 219 || got > 219+100 {
		t.Errorf("busy counts %d after the crash, want 219..%d (what it used, and at most a lease more)", got, 219+100)
	}
	if got := used(tab2, "idle"); got != 3 {
		t.Errorf("idle counts %d after the crash, want its 3: its lease was closed", got)
	}
	if got := used(tab2, "never-seen"); got != 0 {
		t.Errorf("a device never seen counts %d, want 0", got)
	}
	err := s2.view(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketLeases) != nil {
			t.Error("the leases are still in the file after the start")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The charge is durable: a crash right after the start keeps it.
	again := copyStore(t, s2)
	s3 := open(t, again)
	tab3 := newTable(t, 10)
	if _, err := s3.RestoreWindows(tab3); err != nil {
		t.Fatal(err)
	}
	if got, want := used(tab3, "busy"), used(tab2, "busy"); got != want {
		t.Errorf("after a second crash busy counts %d, want the charged %d", got, want)
	}
}

// stepClock is a devicelimit.Clock the test moves.
type stepClock struct{ now devicelimit.Tick }

func (c *stepClock) Now() devicelimit.Tick { return c.now }

// The merge keeps the highest incarnation, and in it the highest cap
// and recorded count, whatever order lease writes and snapshots land in.
func TestMergeLeaseOrderFree(t *testing.T) {
	s := open(t, t.TempDir())
	writes := []struct {
		l   leaseRecord
		how int
	}{
		{leaseRecord{inc: 2, cap: 50, length: time.Second}, leaseWrite},
		{leaseRecord{inc: 2, rec: 30}, leaseMark},
		{leaseRecord{inc: 1, cap: 900, length: time.Second}, leaseWrite}, // an older incarnation, late
		{leaseRecord{inc: 2, cap: 40, length: time.Second}, leaseWrite},  // an older cap, late
		{leaseRecord{inc: 2, rec: 10}, leaseMark},                        // an older mark, late
	}
	for _, w := range writes {
		if err := s.update(func(tx *bolt.Tx) error { return mergeLease(tx, "dev", w.l, w.how) }); err != nil {
			t.Fatal(err)
		}
	}
	err := s.view(func(tx *bolt.Tx) error {
		got, err := decodeLease(tx.Bucket(bucketLeases).Get([]byte("dev")))
		if err != nil {
			return err
		}
		if want := (leaseRecord{inc: 2, cap: 50, rec: 30, length: time.Second}); !reflect.DeepEqual(got, want) {
			t.Errorf("stored %+v, want %+v", got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A device ID too long to be a key keeps its lease and its mark in the
// long buckets, and is charged after a crash like any other.
func TestLeasesOfLongDeviceID(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	tab := newTable(t, 10)
	tab.EnableLeases(devicelimit.DefaultLeasePolicy)
	l := NewLeaser(s, tab, nil)
	clock := &stepClock{now: t0}
	sn := NewSnapshotter(s, tab, clock, time.Hour, nil)
	long := strings.Repeat("x", bolt.MaxKeySize+1)
	q := devicelimit.Quota{Limit: 100, Window: time.Hour}
	for i := range 15 {
		clock.now = clock.now.Add(ms)
		d := tab.AllowAt(long, q, clock.now)
		if !d.Allowed || !tab.WaitLease(d.Lease, 5*time.Second) {
			t.Fatalf("admission %d: %+v", i, d)
		}
		if i == 9 {
			if _, err := sn.Snapshot(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, copyStore(t, s))
	tab2 := newTable(t, 10)
	if _, err := s2.RestoreWindows(tab2); err != nil {
		t.Fatal(err)
	}
	if n, err := s2.SettleLeases(tab2, true, clock.now, clock.now); err != nil || n != 1 {
		t.Fatalf("settle: %d, %v; want 1 window charged", n, err)
	}
	// 10 recorded, 5 after: charged at least those 5, at most a lease
	// (10) beyond the 15.
	if got := tab2.PeekAt(long, q, clock.now).Count; got < 15 || got > 25 {
		t.Errorf("the long ID counts %d after the crash, want 15..25", got)
	}
}

// A lease write keeps the window's counts of the write with the most
// admissions, whatever order the writes commit in; a snapshot deleting
// the window drops them (they must not bring it back after a crash),
// and a record of version 1 (before the counts) still reads.
func TestLeaseRecordKeepsNewestCounts(t *testing.T) {
	s := open(t, t.TempDir())
	winA := devicelimit.Window{Length: time.Second, Head: 7, Counts: []uint32{0, 1, 2}}
	winB := devicelimit.Window{Length: time.Second, Head: 5, Counts: []uint32{0, 0, 1}}
	encA, _ := winA.MarshalBinary()
	encB, _ := winB.MarshalBinary()
	get := func() leaseRecord {
		var got leaseRecord
		if err := s.view(func(tx *bolt.Tx) error {
			var err error
			got, err = decodeLease(bytes.Clone(tx.Bucket(bucketLeases).Get([]byte("dev"))))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	for _, w := range []struct {
		l   leaseRecord
		how int
	}{
		{leaseRecord{inc: 2, cap: 8, length: time.Second, adm: 3, window: encA}, leaseWrite},
		{leaseRecord{inc: 2, cap: 6, length: time.Second, adm: 1, window: encB}, leaseWrite}, // older, late
		{leaseRecord{inc: 2, rec: 2}, leaseMark},
	} {
		if err := s.update(func(tx *bolt.Tx) error { return mergeLease(tx, "dev", w.l, w.how) }); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := get(), (leaseRecord{inc: 2, cap: 8, rec: 2, length: time.Second, adm: 3, window: encA}); !reflect.DeepEqual(got, want) {
		t.Errorf("stored %+v, want %+v", got, want)
	}
	if err := s.update(func(tx *bolt.Tx) error { return mergeLease(tx, "dev", leaseRecord{inc: 2}, leaseWindow) }); err != nil {
		t.Fatal(err)
	}
	if got, want := get(), (leaseRecord{inc: 2, cap: 8, rec: 3, length: time.Second}); !reflect.DeepEqual(got, want) {
		t.Errorf("after the window's deletion: stored %+v, want %+v", got, want)
	}
	v1 := []byte{leaseVersion1, 2, 8, 2, 0}
	if got, err := decodeLease(v1); err != nil || !reflect.DeepEqual(got, leaseRecord{inc: 2, cap: 8, rec: 2}) {
		t.Errorf("version 1 record: %+v, %v", got, err)
	}
	for _, bad := range [][]byte{{leaseVersion1, 2, 8, 2, 0, 9}, {leaseVersion, 2, 8, 2, 0}, {3, 1, 1, 1, 1}} {
		if _, err := decodeLease(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("decodeLease(%v): %v, want ErrCorrupt", bad, err)
		}
	}
}

// A lease record whose window does not decode stops the start after a
// crash with ErrCorrupt naming the device, as any damaged record does.
func TestLeaseRecordDamagedWindow(t *testing.T) {
	s := open(t, t.TempDir())
	bad := leaseRecord{inc: 1, cap: 9, length: time.Second, adm: 5, window: []byte{1, 0xff}}
	if err := s.update(func(tx *bolt.Tx) error { return mergeLease(tx, "dev-7", bad, leaseWrite) }); err != nil {
		t.Fatal(err)
	}
	tab := newTable(t, 10)
	tab.EnableLeases(devicelimit.DefaultLeasePolicy)
	_, err := s.SettleLeases(tab, true, t0, t0)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "dev-7") {
		t.Fatalf("settle over a damaged lease window: %v, want ErrCorrupt naming dev-7", err)
	}
}

// A window reset (or evicted) after a snapshot collected it is deleted
// by that snapshot's transaction; when the window's next incarnation
// took its leases and their writes committed before that transaction,
// the deletion must leave them alone: they hold the new admissions,
// which no snapshot holds yet, and a crash then must cost at most a
// lease, never those admissions.
func TestLeaseWriteOfNextIncarnationSurvivesDeletion(t *testing.T) {
	s := open(t, t.TempDir())
	tab := newTable(t, 10)
	tab.EnableLeases(devicelimit.DefaultLeasePolicy)
	l := NewLeaser(s, tab, nil)
	clock := &stepClock{now: t0}
	sn := NewSnapshotter(s, tab, clock, time.Hour, nil)
	q := devicelimit.Quota{Limit: 100, Window: time.Hour}
	admit := func(n int) {
		for range n {
			clock.now = clock.now.Add(ms)
			d := tab.AllowAt("dev", q, clock.now)
			if !d.Allowed || !tab.WaitLease(d.Lease, 5*time.Second) {
				t.Fatalf("admission: %+v", d)
			}
		}
	}
	admit(5)
	if _, err := sn.Snapshot(); err != nil {
		t.Fatal(err)
	}
	tab.Reset("dev")
	// A snapshot collects the deletion (Snapshotter.snapshot, split at
	// the point where the lease writes below can interleave) ...
	sn.mu.Lock()
	sn.pend.grow(sn.table.Dirty())
	sn.table.CollectLeases(sn.add)
	sn.mu.Unlock()
	// ... the next incarnation admits 50, its lease writes committing
	// (all of them: Close writes those still asked) ...
	admit(50)
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// ... and then the snapshot's transaction commits.
	sn.mu.Lock()
	sn.pend.sort()
	sn.long.sort()
	_, err := sn.write(false)
	sn.pend.reset()
	sn.long.reset()
	sn.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	s2 := open(t, copyStore(t, s)) // kill -9: no final snapshot
	tab2 := newTable(t, 10)
	if _, err := s2.RestoreWindows(tab2); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.SettleLeases(tab2, true, clock.now, clock.now); err != nil {
		t.Fatal(err)
	}
	lease := devicelimit.DefaultLeasePolicy.Size(devicelimit.Limit{Unit: devicelimit.Messages, N: 100, Window: time.Hour}, 1)
	if got := tab2.PeekAt("dev", q, clock.now).Count; got < 50 || got > 50+lease {
		t.Errorf("after the crash the window counts %d, want the 50 admitted since the reset and at most a lease (%d) more", got, lease)
	}
}

// A deletion of an older incarnation, merged after a lease write of a
// newer one, leaves the newer record as it is.
func TestMergeLeaseDeletionOfOlderIncarnation(t *testing.T) {
	s := open(t, t.TempDir())
	win, _ := devicelimit.Window{Length: time.Second, Head: 7, Counts: []uint32{0, 1, 2}}.MarshalBinary()
	newer := leaseRecord{inc: 2, cap: 8, length: time.Second, adm: 3, window: win}
	for _, w := range []struct {
		l   leaseRecord
		how int
	}{
		{leaseRecord{inc: 1, cap: 5, length: time.Second, adm: 4}, leaseWrite},
		{newer, leaseWrite},
		{leaseRecord{inc: 1}, leaseWindow}, // the deletion of incarnation 1, late
	} {
		if err := s.update(func(tx *bolt.Tx) error { return mergeLease(tx, "dev", w.l, w.how) }); err != nil {
			t.Fatal(err)
		}
	}
	err := s.view(func(tx *bolt.Tx) error {
		got, err := decodeLease(bytes.Clone(tx.Bucket(bucketLeases).Get([]byte("dev"))))
		if err != nil {
			return err
		}
		if !reflect.DeepEqual(got, newer) {
			t.Errorf("stored %+v, want %+v", got, newer)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Leases asked early (a device at a lease of 1 asks for the next right
// after an admission) wait for a write that an admission needs, and go
// in it all together: 50 devices' early asks and the lease a new
// device waits for make one transaction. Before, those devices asked
// no lease until their next admission, and that one waited for it.
func TestEarlyLeasesJoinTheNextWrite(t *testing.T) {
	s := open(t, t.TempDir())
	tab := newTable(t, 10)
	tab.EnableLeases(devicelimit.DefaultLeasePolicy)
	l := newLeaser(s, tab, nil, time.Hour, foldLeaseLogAt) // early asks wait for a needed write
	defer l.Close(context.Background())
	q := devicelimit.Quota{Limit: 5, Window: 10 * time.Second} // a lease of 1
	admit := func(device string, at devicelimit.Tick) devicelimit.Decision {
		d := tab.AllowAt(device, q, at)
		if !d.Allowed {
			t.Fatalf("%s refused", device)
		}
		return d
	}
	now := t0
	for i := range 50 {
		if d := admit(fmt.Sprint("meter-", i), now); !tab.WaitLease(d.Lease, 10*time.Second) {
			t.Fatalf("meter-%d: first lease not written", i)
		}
	}
	// Other devices' first leases: writes that make the meters' next
	// asks several batches after their last (asks in the batches right
	// after wake the writer at once, devicelimit's fastAsk).
	for i := range 3 {
		if d := admit(fmt.Sprint("other-", i), now); !tab.WaitLease(d.Lease, 10*time.Second) {
			t.Fatalf("other-%d: first lease not written", i)
		}
	}
	writes0, records0 := l.Stats()
	now = now.Add(5 * time.Second)
	for i := range 50 {
		if d := admit(fmt.Sprint("meter-", i), now); d.Lease != 0 {
			t.Fatalf("meter-%d's second admission waits for lease batch %d, want its lease durable", i, d.Lease)
		}
	}
	if d := admit("newcomer", now); !tab.WaitLease(d.Lease, 10*time.Second) {
		t.Fatal("the newcomer's lease not written")
	}
	writes, records := l.Stats()
	if writes-writes0 != 1 || records-records0 != 51 {
		t.Fatalf("%d lease writes of %d records, want 1 of 51 (50 early asks and the newcomer's)", writes-writes0, records-records0)
	}
	// The next admissions find their leases durable.
	now = now.Add(5 * time.Second)
	for i := range 50 {
		if d := admit(fmt.Sprint("meter-", i), now); d.Lease != 0 {
			t.Fatalf("meter-%d's third admission waits for lease batch %d", i, d.Lease)
		}
	}
}

// An early ask that no admission needs yet is written all the same,
// lazyAfter after it was asked, with no admission waiting nor other
// writes.
func TestEarlyLeaseWrittenWithoutAWait(t *testing.T) {
	s := open(t, t.TempDir())
	tab := newTable(t, 10)
	tab.EnableLeases(devicelimit.DefaultLeasePolicy)
	l := NewLeaser(s, tab, nil)
	defer l.Close(context.Background())
	q := devicelimit.Quota{Limit: 5, Window: 10 * time.Second}
	for _, device := range []string{"meter", "other-1", "other-2", "other-3"} {
		if d := tab.AllowAt(device, q, t0); !tab.WaitLease(d.Lease, 10*time.Second) {
			t.Fatalf("%s: first lease not written", device)
		}
	}
	writes0, records0 := l.Stats()
	if d := tab.AllowAt("meter", q, t0.Add(5*time.Second)); !d.Allowed || d.Lease != 0 {
		t.Fatalf("second admission %+v, want admitted under its durable lease", d)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if writes, records := l.Stats(); records > records0 {
			if writes != writes0+1 || records != records0+1 {
				t.Fatalf("%d lease writes of %d records, want 1 of 1", writes-writes0, records-records0)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease asked early was not written in 30 s")
		}
		time.Sleep(10 * time.Millisecond) // polling the condition
	}
	if cap := foldedLease(t, s, "meter").cap; cap != 3 {
		t.Fatalf("meter's stored cap %d, want 3: its two admissions and a lease of 1", cap)
	}
}

// foldedLease folds the lease log of s and returns key's record.
func foldedLease(t *testing.T, s *Store, key string) leaseRecord {
	t.Helper()
	var rec leaseRecord
	err := s.update(func(tx *bolt.Tx) error {
		if _, _, err := foldLeaseLog(tx, -1); err != nil {
			return err
		}
		var err error
		rec, err = decodeLease(bytes.Clone(tx.Bucket(bucketLeases).Get([]byte(key))))
		return err
	})
	if err != nil {
		t.Fatalf("%s's lease record: %v", key, err)
	}
	return rec
}

// TestLeaseTxMatchesOneByOne: merges in one transaction (leaseTx, as a
// lease write and a snapshot make them: buckets looked up once, reads
// through kept cursors, keys and values in one buffer) leave the lease
// buckets byte for byte as the same merges made one per transaction,
// over short and long device IDs interleaved, with the same key merged
// several times in one transaction (a read seeing the transaction's own
// earlier put), deletions of keys never leased, and buckets made in the
// middle.
func TestLeaseTxMatchesOneByOne(t *testing.T) {
	long := strings.Repeat("L", bolt.MaxKeySize+1)
	keys := []string{"a", "b", long + "1", "c", long + "2"}
	rng := rand.New(rand.NewPCG(41, 1))
	type op struct {
		key string
		l   leaseRecord
		how int
	}
	var ops []op
	for range 400 {
		l := leaseRecord{inc: uint64(1 + rng.IntN(3)), length: time.Second}
		how := rng.IntN(3)
		switch how {
		case leaseWrite:
			l.cap, l.adm = uint64(rng.IntN(50)), uint64(rng.IntN(50))
			if rng.IntN(2) == 0 {
				l.window = []byte{byte(rng.IntN(256)), byte(rng.IntN(256))}
			}
		case leaseMark:
			l.rec = uint64(rng.IntN(50))
		}
		ops = append(ops, op{keys[rng.IntN(len(keys))], l, how})
	}
	dump := func(s *Store) string { return dumpLeases(t, s) }
	one, batched := open(t, t.TempDir()), open(t, t.TempDir())
	for i := 0; i < len(ops); i += 37 { // transactions of 37 merges
		chunk := ops[i:min(i+37, len(ops))]
		for _, o := range chunk {
			if err := one.update(func(tx *bolt.Tx) error { return mergeLease(tx, o.key, o.l, o.how) }); err != nil {
				t.Fatal(err)
			}
		}
		if err := batched.update(func(tx *bolt.Tx) error {
			lt := leaseTx{tx: tx}
			for _, o := range chunk {
				if err := lt.merge(o.key, o.l, o.how); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if a, b := dump(one), dump(batched); a != b {
			t.Fatalf("after %d merges: one by one\n%s\nin one transaction\n%s", i+len(chunk), a, b)
		}
	}
	if d := dump(one); !strings.Contains(d, "leases-long") || !strings.Contains(d, "leases ") {
		t.Fatalf("the ops left no record in one of the buckets:\n%s", d)
	}
}

// mergeLease merges one lease write, snapshot mark or window deletion
// (how) into the record of key in tx, in a leaseTx of its own.
func mergeLease(tx *bolt.Tx, key string, l leaseRecord, how int) error {
	return (&leaseTx{tx: tx}).merge(key, l, how)
}
