package persist

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
)

// longIDs are device IDs too long to be bbolt keys: just over the limit
// and MQTT's longest.
var longIDs = []string{strings.Repeat("L", 40000), strings.Repeat("M", devicelimit.MaxDeviceID)}

// longStored returns the number of records in the long bucket name.
func longStored(t testing.TB, s *Store, name []byte) int {
	t.Helper()
	n := 0
	err := s.view(func(tx *bolt.Tx) error {
		if b := tx.Bucket(name); b != nil {
			n = b.Stats().KeyN
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestLongDeviceWindowsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	tab := newTable(t, 10)
	clock := devicelimit.NewManualClock(t0)
	sn := NewSnapshotter(s, tab, clock, 0, nil)
	devices := append([]string{"short"}, longIDs...)
	for i, d := range devices {
		for range i + 2 {
			tab.AllowAt(d, q, t0)
		}
	}
	st, err := sn.Snapshot()
	if err != nil || st.Windows != 3 {
		t.Fatalf("snapshot %+v, %v; want 3 windows", st, err)
	}
	if n := longStored(t, s, bucketWindowsLong); n != 2 {
		t.Fatalf("%d long windows stored, want 2", n)
	}
	if err := sn.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, dir)
	tab2 := newTable(t, 10)
	if n, err := s.RestoreWindows(tab2); err != nil || n != 3 {
		t.Fatalf("restore: %d, %v; want 3", n, err)
	}
	for _, at := range []devicelimit.Tick{t0, t0.Add(500 * ms), t0.Add(2 * time.Second)} {
		for _, d := range devices {
			want, got := tab.PeekAt(d, q, at), tab2.PeekAt(d, q, at)
			if got != want {
				t.Fatalf("device of %d bytes at %v: restored decision %+v, want %+v", len(d), at, got, want)
			}
		}
	}

	// Reset and eviction delete the long windows.
	sn = NewSnapshotter(s, tab2, clock, 0, nil)
	if !tab2.Reset(longIDs[0]) {
		t.Fatal("reset found no window")
	}
	if st, err := sn.Snapshot(); err != nil || st.Deleted != 1 {
		t.Fatalf("snapshot after reset %+v, %v; want 1 deleted", st, err)
	}
	if n := longStored(t, s, bucketWindowsLong); n != 1 {
		t.Fatalf("%d long windows stored after reset, want 1", n)
	}
	tab2.Sweep(t0.Add(time.Hour))
	if st, err := sn.Snapshot(); err != nil || st.Deleted != 2 {
		t.Fatalf("snapshot after sweep %+v, %v; want 2 deleted", st, err)
	}
	if n := longStored(t, s, bucketWindowsLong); n != 0 {
		t.Fatalf("%d long windows stored after eviction, want 0", n)
	}
	tab3 := newTable(t, 10)
	if n, err := s.RestoreWindows(tab3); err != nil || n != 0 {
		t.Fatalf("restore after deletes: %d, %v; want 0", n, err)
	}
}

func TestLongDeviceOverridesRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	r := newResolver(t, 10)
	o := devicelimit.Override{Quota: devicelimit.Quota{Limit: 7, Window: 3 * time.Second, Policy: devicelimit.Policy(1)}}
	for _, d := range longIDs {
		if err := s.SetOverride(r, d, o); err != nil {
			t.Fatalf("set override for %d bytes: %v", len(d), err)
		}
	}
	// A short ID made of a long one's hash lands in the other bucket.
	short := string(longKey(longIDs[0]))
	if err := s.SetOverride(r, short, devicelimit.Override{Quota: q}); err != nil {
		t.Fatal(err)
	}
	expired := strings.Repeat("E", 50000)
	if err := s.SetOverride(r, expired, devicelimit.Override{Quota: q, ExpiresAt: t0.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if n := longStored(t, s, bucketOverridesLong); n != 3 {
		t.Fatalf("%d long overrides stored, want 3", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, dir)
	r2 := newResolver(t, 10)
	if n, err := s.RestoreOverrides(r2, t0.Add(time.Hour)); err != nil || n != 3 {
		t.Fatalf("restore: %d, %v; want 3", n, err)
	}
	for _, d := range longIDs {
		if got, ok := r2.Override(d, t0); !ok || !reflect.DeepEqual(got, o) {
			t.Fatalf("device of %d bytes: restored %+v, %v; want %+v", len(d), got, ok, o)
		}
	}
	if got, ok := r2.Override(short, t0); !ok || got.Quota != q {
		t.Fatalf("short device: restored %+v, %v; want %+v", got, ok, q)
	}
	if _, ok := r2.Override(expired, t0); ok {
		t.Fatal("expired long override restored")
	}
	if n := longStored(t, s, bucketOverridesLong); n != 2 {
		t.Fatalf("%d long overrides stored after restore, want 2 (expired deleted)", n)
	}

	// Deleting the long one leaves the short one named by its hash.
	if ok, err := s.DeleteOverride(r2, longIDs[0]); err != nil || !ok {
		t.Fatalf("delete: %v, %v", ok, err)
	}
	if ok, err := s.DeleteOverride(r2, longIDs[0]); err != nil || ok {
		t.Fatalf("second delete: %v, %v; want false", ok, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	r3 := newResolver(t, 10)
	if n, err := s.RestoreOverrides(r3, t0); err != nil || n != 2 {
		t.Fatalf("restore after delete: %d, %v; want 2", n, err)
	}
	if _, ok := r3.Override(longIDs[0], t0); ok {
		t.Fatal("deleted long override restored")
	}
	if _, ok := r3.Override(short, t0); !ok {
		t.Fatal("short override named by a hash lost")
	}
}

func TestLongDeviceCorruptRecord(t *testing.T) {
	long := longIDs[0]
	good := appendLongValue(nil, long, []byte{1})
	other := appendLongValue(nil, strings.Repeat("z", 40000), nil)
	for name, c := range map[string]struct {
		bucket []byte
		key    []byte
		value  []byte
	}{
		"window under another hash":   {bucketWindowsLong, longKey("nope"), good},
		"override under another hash": {bucketOverridesLong, longKey(long), appendOverride(other, devicelimit.Override{Quota: q})},
		"truncated ID":                {bucketWindowsLong, longKey(long), good[:100]},
		"short ID":                    {bucketOverridesLong, longKey("a"), appendOverride(appendLongValue(nil, "a", nil), devicelimit.Override{Quota: q})},
	} {
		dir := t.TempDir()
		s := open(t, dir)
		err := s.update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists(c.bucket)
			if err != nil {
				return err
			}
			return b.Put(c.key, c.value)
		})
		if err != nil {
			t.Fatal(err)
		}
		if string(c.bucket) == string(bucketWindowsLong) {
			_, err = s.RestoreWindows(newTable(t, 10))
		} else {
			_, err = s.RestoreOverrides(newResolver(t, 10), t0)
		}
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), s.Path()) {
			t.Fatalf("%s: got %v, want ErrCorrupt naming %s", name, err, s.Path())
		}
	}
}
