package persist

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
)

// dumpLeases returns the records of "leases" and "leases-long", one line
// each, and fails when the lease log is still there.
func dumpLeases(t *testing.T, s *Store) string {
	t.Helper()
	var out strings.Builder
	err := s.view(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketLeaseLog) != nil {
			t.Error("the lease log is still there")
		}
		for _, name := range [][]byte{bucketLeases, bucketLeasesLong} {
			if b := tx.Bucket(name); b != nil {
				if err := b.ForEach(func(k, v []byte) error {
					fmt.Fprintf(&out, "%s %x %x\n", name, k, v)
					return nil
				}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// Lease writes appended to the log in batches of any size and folded at
// any points leave "leases" exactly as merging each write in turn did:
// the log keeps their order, and folding merges them in it.
func TestLeaseLogFoldMatchesMerge(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 43))
	long := strings.Repeat("l", bolt.MaxKeySize+10)
	keys := []string{"a", "b", "c", long + "1", long + "2"}
	win, err := devicelimit.Window{Length: time.Second, Head: 3, Counts: []uint32{1, 2, 3}}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	type write struct {
		key string
		l   devicelimit.Lease
	}
	for round := range 20 {
		var writes []write
		for range 200 {
			l := devicelimit.Lease{Inc: uint64(1 + rng.IntN(4)), Cap: uint64(rng.IntN(100)), Length: time.Second, Adm: uint64(rng.IntN(100))}
			if rng.IntN(2) == 0 {
				l.Window = win
			}
			writes = append(writes, write{keys[rng.IntN(len(keys))], l})
		}
		direct, logged := open(t, t.TempDir()), open(t, t.TempDir())
		for _, w := range writes {
			rec := leaseRecord{inc: w.l.Inc, cap: w.l.Cap, length: w.l.Length, adm: w.l.Adm, window: w.l.Window}
			if err := direct.update(func(tx *bolt.Tx) error { return mergeLease(tx, w.key, rec, leaseWrite) }); err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < len(writes); {
			j := min(len(writes), i+1+rng.IntN(40))
			var value []byte
			for _, w := range writes[i:j] {
				value = appendLogEntry(value, w.key, w.l)
			}
			// Fold now and then, all of the log or its oldest part,
			// and all of it at the end.
			fold, limit := rng.IntN(4) == 0, -1
			if rng.IntN(2) == 0 {
				limit = rng.IntN(60)
			}
			if j == len(writes) {
				fold, limit = true, -1
			}
			err := logged.update(func(tx *bolt.Tx) error {
				if err := appendLeaseLog(tx, value); err != nil {
					return err
				}
				if fold {
					_, _, err := foldLeaseLog(tx, limit)
					return err
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			i = j
		}
		if got, want := dumpLeases(t, logged), dumpLeases(t, direct); got != want {
			t.Fatalf("round %d: folded log\n%s\nwant as merged one by one\n%s", round, got, want)
		}
	}
}

// A lease write still in the log when the gateway crashed is settled as
// one merged: SettleLeases folds the log first, and the window is
// charged what its lease could admit beyond the write's counts.
func TestLeaseLogSettledAfterCrash(t *testing.T) {
	s := open(t, t.TempDir())
	tab := newTable(t, 10)
	tab.EnableLeases(devicelimit.LeasePolicy{Share: 0.1, Min: 5, Max: 5})
	l := NewLeaser(s, tab, nil)
	q := devicelimit.Quota{Limit: 100, Window: time.Hour}
	now := t0
	for range 12 {
		now = now.Add(ms)
		if d := tab.AllowAt("dev", q, now); !d.Allowed || !tab.WaitLease(d.Lease, 10*time.Second) {
			t.Fatalf("admission %+v", d)
		}
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if folds, _ := l.Folds(); folds != 0 {
		t.Fatalf("%d foldings of a log of a few entries", folds)
	}
	err := s.view(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketLeaseLog) == nil || tx.Bucket(bucketLeases) != nil {
			t.Error("want the lease writes in the log, none folded")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s2, tab2, charged := afterCrash(t, s, devicelimit.LeasePolicy{Share: 0.1, Min: 5, Max: 5}, now)
	// 12 admitted, the last lease write's cap 15 or 20 (a lease of 5
	// asked early): restored from the write's counts and charged the
	// rest of the lease, at most 5 beyond the 12.
	if got := tab2.PeekAt("dev", q, now).Count; charged != 1 || got < 12 || got > 17 {
		t.Errorf("after the crash: %d windows charged, dev counts %d; want 1, and from 12 to 17", charged, got)
	}
	err = s2.view(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketLeases, bucketLeasesLong, bucketLeaseLog} {
			if tx.Bucket(name) != nil {
				t.Errorf("the settle left bucket %s", name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A lease write that reached the log before its window's deletion was
// merged (the snapshot's transaction came first) and is folded after it
// keeps the lease closed, as when it commits after the deletion
// (TestMergeLeaseWriteAfterDeletion).
func TestLeaseLogWriteFoldedAfterDeletion(t *testing.T) {
	s := open(t, t.TempDir())
	counts := make([]uint32, 11)
	counts[9], counts[10] = 4, 2
	win, err := devicelimit.Window{Length: time.Hour, Head: 10, Counts: counts}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	err = s.update(func(tx *bolt.Tx) error {
		return appendLeaseLog(tx, appendLogEntry(nil, "dev", devicelimit.Lease{Inc: 3, Cap: 8, Length: time.Hour, Adm: 6, Window: win}))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.update(func(tx *bolt.Tx) error { return mergeLease(tx, "dev", leaseRecord{inc: 3, rec: 8}, leaseWindow) }); err != nil {
		t.Fatal(err)
	}
	settledClosed(t, s)
}

// The Leaser folds the log once it holds more entries than its
// threshold, and what the foldings left plus what is still logged
// settles as everything merged.
func TestLeaserFoldsLog(t *testing.T) {
	s := open(t, t.TempDir())
	tab := newTable(t, 10)
	tab.EnableLeases(devicelimit.LeasePolicy{Share: 0.1, Min: 1, Max: 1})
	l := newLeaser(s, tab, nil, time.Hour, 8)
	q := devicelimit.Quota{Limit: 1000, Window: time.Hour}
	now := t0
	const devices, rounds = 5, 10
	for range rounds {
		for d := range devices {
			now = now.Add(ms)
			if dec := tab.AllowAt(fmt.Sprint("dev-", d), q, now); !dec.Allowed || !tab.WaitLease(dec.Lease, 10*time.Second) {
				t.Fatalf("admission %+v", dec)
			}
		}
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	folds, entries := l.Folds()
	_, records := l.Stats()
	if folds == 0 || entries == 0 || entries > records {
		t.Fatalf("%d foldings of %d entries of %d records written, want some of at most all", folds, entries, records)
	}
	for d := range devices {
		// Every admission waited for a cap covering it, and a lease of
		// 1 asked early may have been written beyond the last.
		if rec := foldedLease(t, s, fmt.Sprint("dev-", d)); rec.cap < rounds || rec.cap > rounds+1 {
			t.Errorf("dev-%d: stored cap %d, want %d or %d", d, rec.cap, rounds, rounds+1)
		}
	}
}

// A damaged lease log is refused by the settle, naming the log, and
// nothing is settled.
func TestLeaseLogDamaged(t *testing.T) {
	good := appendLogEntry(nil, "dev", devicelimit.Lease{Inc: 1, Cap: 5, Length: time.Second, Adm: 2})
	for name, value := range map[string][]byte{
		"truncated":    good[:len(good)-2],
		"key too long": {0x7f, 'd'},
		// key "dev", inc 1, cap 5, length 1000 ns, adm 2, a window of
		// 40 bytes that are not there
		"window beyond the value": {3, 'd', 'e', 'v', 1, 5, 0xe8, 0x07, 2, 40},
	} {
		t.Run(name, func(t *testing.T) {
			s := open(t, t.TempDir())
			if err := s.update(func(tx *bolt.Tx) error { return appendLeaseLog(tx, value) }); err != nil {
				t.Fatal(err)
			}
			tab := newTable(t, 10)
			tab.EnableLeases(devicelimit.DefaultLeasePolicy)
			_, err := s.SettleLeases(tab, true, t0, t0)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "lease log") {
				t.Fatalf("settle of a damaged log: %v, want ErrCorrupt naming the lease log", err)
			}
			if err := s.view(func(tx *bolt.Tx) error {
				if tx.Bucket(bucketLeaseLog) == nil {
					t.Error("the damaged log was deleted")
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A lease log that cannot be folded (damaged) does not stop the lease
// writes: the first write that tries to fold fails, those after it only
// append, and the admissions waiting for them go on; the next start
// refuses the file, naming the log.
func TestLeaserGoesOnPastDamagedLog(t *testing.T) {
	s := open(t, t.TempDir())
	if err := s.update(func(tx *bolt.Tx) error { return appendLeaseLog(tx, []byte{0x7f, 'd'}) }); err != nil {
		t.Fatal(err)
	}
	tab := newTable(t, 10)
	tab.EnableLeases(devicelimit.LeasePolicy{Share: 0.1, Min: 1, Max: 1})
	l := newLeaser(s, tab, nil, time.Hour, 1) // every write would fold
	q := devicelimit.Quota{Limit: 1000, Window: time.Hour}
	now := t0
	for i := range 5 {
		now = now.Add(ms)
		if d := tab.AllowAt(fmt.Sprint("dev-", i), q, now); !d.Allowed || !tab.WaitLease(d.Lease, 10*time.Second) {
			t.Fatalf("admission %d: %+v, its lease not written", i, d)
		}
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if folds, _ := l.Folds(); folds != 0 {
		t.Errorf("%d foldings of a damaged log", folds)
	}
	if writes, records := l.Stats(); writes < 5 || records < 5 {
		t.Errorf("%d lease writes of %d records, want the 5 admissions' at least", writes, records)
	}
	tab2 := newTable(t, 10)
	tab2.EnableLeases(devicelimit.DefaultLeasePolicy)
	if _, err := s.SettleLeases(tab2, true, now, now); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "lease log") {
		t.Fatalf("settle of the damaged log: %v, want ErrCorrupt naming the lease log", err)
	}
}
