package persist

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
)

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if m := s.Meta(); !m.New || m.Schema != SchemaVersion || m.HighWater != 0 || m.CleanShutdown {
		t.Fatalf("new store meta %+v", m)
	}
	if err := s.MarkRunning(t0); err != nil {
		t.Fatal(err)
	}
	tab := newTable(t, 10)
	clock := devicelimit.NewManualClock(t0)
	sn := NewSnapshotter(s, tab, clock, time.Second, nil)

	devices := []string{"a", "b", "c", "gone-reset", "gone-swept"}
	for i, d := range devices {
		for k := 0; k <= i; k++ {
			tab.AllowAt(d, q, t0.Add(time.Duration(k*100)*ms))
		}
	}
	tab.AllowAt("gone-swept", devicelimit.Quota{Limit: 5, Window: 100 * ms}, t0)
	clock.Advance(500 * ms)
	st, err := sn.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if st.Windows != 5 || st.Deleted != 0 || st.Bytes == 0 {
		t.Fatalf("first snapshot %+v, want 5 windows", st)
	}
	// After the snapshot: a reset, an eviction, and a change.
	tab.Reset("gone-reset")
	tab.AllowAt("a", q, t0.Add(600*ms))
	clock.Advance(2 * time.Second)
	tab.Sweep(clock.Now()) // evicts everything expired...
	for _, d := range []string{"a", "b", "c"} {
		tab.AllowAt(d, q, clock.Now()) // ...so keep these alive
	}
	if err := sn.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, dir)
	m := s.Meta()
	if m.New || m.HighWater != clock.Now() || !m.CleanShutdown {
		t.Fatalf("reopened meta %+v, want high-water %v, clean", m, clock.Now())
	}
	tab2 := newTable(t, 10)
	n, err := s.RestoreWindows(tab2)
	if err != nil || n != 3 {
		t.Fatalf("restored %d windows (%v), want 3", n, err)
	}
	for _, d := range []string{"gone-reset", "gone-swept"} {
		if w, ok := tab2.Snapshot(d); ok {
			t.Fatalf("%s was deleted but restored: %+v", d, w)
		}
	}
	// The restored table decides exactly as the original.
	for _, at := range []time.Duration{0, 10 * ms, 200 * ms, 900 * ms, 1100 * ms, 3 * time.Second} {
		now := clock.Now().Add(at)
		for _, d := range []string{"a", "b", "c"} {
			if got, want := tab2.AllowAt(d, q, now), tab.AllowAt(d, q, now); got != want {
				t.Fatalf("%s at +%v: restored %+v, original %+v", d, at, got, want)
			}
		}
	}
}

func TestSnapshotWritesOnlyChanges(t *testing.T) {
	s := open(t, t.TempDir())
	tab := newTable(t, 10)
	clock := devicelimit.NewManualClock(t0)
	sn := NewSnapshotter(s, tab, clock, 0, nil)
	tab.AllowAt("a", q, t0)
	tab.AllowAt("b", q, t0)
	if st, err := sn.Snapshot(); err != nil || st.Windows != 2 {
		t.Fatalf("first snapshot %+v, %v", st, err)
	}
	last, written := sn.Stats()
	if written != 1 || last.Windows != 2 || last.Bytes <= 0 || last.Took <= 0 {
		t.Fatalf("Stats after the first snapshot: %+v, %d written", last, written)
	}
	before := txID(t, s)
	clock.Advance(time.Second)
	if st, err := sn.Snapshot(); err != nil || st != (SnapshotStats{}) {
		t.Fatalf("snapshot with no change: %+v, %v; want zero stats", st, err)
	}
	if again, n := sn.Stats(); n != 1 || again != last {
		t.Fatalf("a snapshot with no change altered Stats: %+v, %d", again, n)
	}
	// It writes the clock's high-water alone: after a crash that bounds
	// when the forgotten admissions were made.
	if after := txID(t, s); after != before+1 {
		t.Fatalf("snapshot with no change committed %d transactions, want 1 (the high-water)", after-before)
	}
	if hw := storedHighWater(t, s); hw != clock.Now() {
		t.Fatalf("high-water after a snapshot with no change: %v, want %v", hw, clock.Now())
	}
	// A refusal is no change either.
	for range 10 {
		tab.AllowAt("a", devicelimit.Quota{Limit: 1, Window: time.Second}, t0)
	}
	if st, err := sn.Snapshot(); err != nil || st != (SnapshotStats{}) {
		t.Fatalf("snapshot after refusals: %+v, %v; want zero stats", st, err)
	}
	tab.AllowAt("b", q, clock.Now())
	if st, err := sn.Snapshot(); err != nil || st.Windows != 1 {
		t.Fatalf("snapshot after one change: %+v, %v; want 1 window", st, err)
	}
}

func TestSnapshotChunks(t *testing.T) {
	s := open(t, t.TempDir())
	tab := newTable(t, 10)
	clock := devicelimit.NewManualClock(t0)
	sn := NewSnapshotter(s, tab, clock, 0, nil)
	sn.chunk = 7
	const n = 50
	for i := range n {
		tab.AllowAt(fmt.Sprintf("dev-%03d", i), q, t0)
	}
	before := txID(t, s)
	st, err := sn.Snapshot()
	if err != nil || st.Windows != n {
		t.Fatalf("snapshot %+v, %v; want %d windows", st, err, n)
	}
	if txs, want := txID(t, s)-before, (n+6)/7; txs != want {
		t.Fatalf("%d transactions, want %d", txs, want)
	}
	got := stored(t, s)
	if len(got) != n {
		t.Fatalf("%d windows stored, want %d", len(got), n)
	}
	for i := range n {
		d := fmt.Sprintf("dev-%03d", i)
		w, _ := tab.Snapshot(d)
		want, _ := w.MarshalBinary()
		if string(got[d]) != string(want) {
			t.Fatalf("%s: stored % x, want % x", d, got[d], want)
		}
	}
	// The high-water went with the last chunk.
	dir := copyStore(t, s)
	if m := open(t, dir).Meta(); m.HighWater != t0 {
		t.Fatalf("high-water %v, want %v", m.HighWater, t0)
	}
}

func TestMarkRunningThenCrash(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	tab := newTable(t, 10)
	sn := NewSnapshotter(s, tab, devicelimit.NewManualClock(t0), 0, nil)
	if err := sn.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, dir)
	if m := s.Meta(); !m.CleanShutdown || m.HighWater != t0 {
		t.Fatalf("after a clean close: %+v", m)
	}
	if err := s.MarkRunning(t0); err != nil {
		t.Fatal(err)
	}
	tab.AllowAt("a", q, t0.Add(time.Second))
	sn = NewSnapshotter(s, tab, devicelimit.NewManualClock(t0.Add(time.Second)), 0, nil)
	if _, err := sn.Snapshot(); err != nil {
		t.Fatal(err)
	}
	// The process dies here: the file is what it is.
	m := open(t, copyStore(t, s)).Meta()
	if m.CleanShutdown || m.HighWater != t0.Add(time.Second) || m.New {
		t.Fatalf("after a crash: %+v, want not clean, high-water %v", m, t0.Add(time.Second))
	}
}

func TestSnapshotterClose(t *testing.T) {
	s := open(t, t.TempDir())
	tab := newTable(t, 10)
	sn := NewSnapshotter(s, tab, devicelimit.NewManualClock(t0), 0, nil)
	tab.AllowAt("a", q, t0)
	// Without Start (a failed start-up), Close still writes.
	if err := sn.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := sn.Close(t.Context()); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if len(stored(t, s)) != 1 {
		t.Fatal("final snapshot not written")
	}
	if _, err := sn.Snapshot(); !errors.Is(err, ErrClosed) {
		t.Fatalf("snapshot after close: %v, want ErrClosed", err)
	}
	sn.Start() // does nothing
	s.Close()
	if err := s.Close(); err != nil {
		t.Fatalf("second store close: %v", err)
	}
	sn2 := NewSnapshotter(s, tab, devicelimit.NewManualClock(t0), 0, nil)
	tab.AllowAt("a", q, t0)
	if _, err := sn2.Snapshot(); !errors.Is(err, ErrClosed) {
		t.Fatalf("snapshot to a closed store: %v, want ErrClosed", err)
	}
	if err := s.MarkRunning(t0); !errors.Is(err, ErrClosed) {
		t.Fatalf("mark running on a closed store: %v, want ErrClosed", err)
	}
}

func TestSnapshotKeepsDevicesBeyondKeyLimit(t *testing.T) {
	var logs logBuffer
	s := open(t, t.TempDir())
	tab := newTable(t, 10)
	sn := NewSnapshotter(s, tab, devicelimit.NewManualClock(t0), 0, newLogger(&logs))
	long := strings.Repeat("x", 40000)
	tab.AllowAt(long, q, t0)
	tab.AllowAt("a", q, t0)
	st, err := sn.Snapshot()
	if err != nil || st.Windows != 2 {
		t.Fatalf("snapshot %+v, %v; want 2 windows", st, err)
	}
	tab.AllowAt(long, q, t0)
	if st, err := sn.Snapshot(); err != nil || st.Windows != 1 {
		t.Fatalf("snapshot %+v, %v; want 1 window", st, err)
	}
	if n := logs.count("level=WARN"); n != 0 {
		t.Fatalf("%d warnings, want none:\n%s", n, logs.String())
	}
	if got := stored(t, s); len(got) != 1 || got["a"] == nil {
		t.Fatalf("windows bucket holds %d keys, want only the short one", len(got))
	}
}

func TestSnapshotDeletesWindowsThatEmptied(t *testing.T) {
	s := open(t, t.TempDir())
	tab := newTable(t, 10)
	sn := NewSnapshotter(s, tab, devicelimit.NewManualClock(t0), 0, nil)
	tab.AllowAt("a", q, t0)
	tab.AllowAt("b", q, t0)
	if _, err := sn.Snapshot(); err != nil {
		t.Fatal(err)
	}
	// a gains a count, then a sweep two windows later finds all its
	// counts expired and evicts it while it waits for the next
	// snapshot; b is admitted again in time to stay. (A peek no longer
	// expires counts: it changes nothing.)
	tab.AllowAt("a", q, t0.Add(10*ms))
	tab.AllowAt("b", q, t0.Add(2*q.Window-10*ms))
	if n := tab.Sweep(t0.Add(2 * q.Window)); n != 1 {
		t.Fatalf("sweep evicted %d windows, want a's", n)
	}
	st, err := sn.Snapshot()
	if err != nil || st.Windows != 1 || st.Deleted != 1 {
		t.Fatalf("snapshot %+v, %v; want b written and a's deletion", st, err)
	}
	if got := stored(t, s); len(got) != 1 || got["b"] == nil {
		t.Fatalf("stored %v, want only b", got)
	}
	w, _ := tab.Snapshot("b")
	enc, _ := w.MarshalBinary()
	if emptyWindow(enc) {
		t.Fatal("b's window reads as empty")
	}
}

// storedHighWater reads the clock high-water the store holds now.
func storedHighWater(t *testing.T, s *Store) devicelimit.Tick {
	t.Helper()
	var m Meta
	err := s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMeta)
		var err error
		m, err = decodeMeta(b.Get(keySchema), b.Get(keyClock), b.Get(keyClean))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m.HighWater
}
