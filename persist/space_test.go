package persist

import (
	"bytes"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// floorStore opens a store in a fresh directory with a free-space floor
// of floor bytes, whose filesystem reports free bytes free (the test
// changes it) and whose clock is the test's.
func floorStore(t *testing.T, floor int64, free *atomic.Int64, now *atomic.Int64) *Store {
	t.Helper()
	s, err := Open(t.TempDir(), Options{MinFreeBytes: floor,
		DiskFree: func(string) (int64, bool) { return free.Load(), true }})
	if err != nil {
		t.Fatal(err)
	}
	s.space.now = func() time.Time { return time.Unix(0, now.Load()) }
	t.Cleanup(func() { s.Close() })
	return s
}

// TestFloorRefusesAppends: below the floor, forward appends and
// deferred messages are refused with ErrLowSpace, nothing stored, and
// the health fails, naming the floor; deletions still go. Once the room
// returns, appends go and the health is ok again.
func TestFloorRefusesAppends(t *testing.T) {
	var free, now atomic.Int64
	free.Store(1 << 30)
	now.Store(time.Unix(1000, 0).UnixNano())
	s := floorStore(t, 8<<20, &free, &now)
	rec := bytes.Repeat([]byte("r"), 1000)
	if err := s.AppendForward("up/0", 1, rec); err != nil {
		t.Fatal(err)
	}
	free.Store(7 << 20) // less the few free pages of a new file
	if s.SpaceLow() {
		t.Fatal("SpaceLow before a commit found the floor")
	}
	if err := s.AppendForward("up/0", 2, rec); !errors.Is(err, ErrLowSpace) || !strings.Contains(err.Error(), "persist.min_free_bytes 8388608") {
		t.Fatalf("append below the floor: %v, want ErrLowSpace naming the key and its value", err)
	}
	if !s.SpaceLow() {
		t.Fatal("SpaceLow false below the floor")
	}
	if err := s.Enqueue("dev-1", 1, rec); !errors.Is(err, ErrLowSpace) {
		t.Fatalf("deferral below the floor: %v, want ErrLowSpace", err)
	}
	if h := s.Health(); !h.Failing || !strings.Contains(h.Err, "min_free_bytes") || h.Since.IsZero() {
		t.Fatalf("health below the floor: %+v, want failing", h)
	}
	if n, _, _, _, err := s.ForwardStats("up/0"); err != nil || n != 1 {
		t.Fatalf("log holds %d (%v), want only the message appended above the floor", n, err)
	}
	if msgs, _, err := s.DeferredStats(); err != nil || msgs != 0 {
		t.Fatalf("deferred %d (%v), want none", msgs, err)
	}
	if err := s.DeleteForward("up/0", []uint64{1}); err != nil {
		t.Fatalf("delete below the floor: %v", err)
	}
	free.Store(1 << 30)
	now.Add(int64(time.Second))
	if h := s.Health(); h.Failing || s.SpaceLow() {
		t.Fatalf("health with room again: %+v", h)
	}
	if err := s.AppendForward("up/0", 2, rec); err != nil {
		t.Fatalf("append with room again: %v", err)
	}
}

// TestFloorCountsFreePagesInTheFile: the room is the filesystem's free
// space plus the data file's free pages. With the filesystem below the
// floor, an append that fits in the pages a deletion freed goes (the
// file does not grow); one larger than them is refused.
func TestFloorCountsFreePagesInTheFile(t *testing.T) {
	var free, now atomic.Int64
	free.Store(1 << 30)
	now.Store(time.Unix(1000, 0).UnixNano())
	const floor = 64 << 20
	s := floorStore(t, floor, &free, &now)
	rec := bytes.Repeat([]byte("r"), 1000)
	var seqs []uint64
	var waits []Queued
	for seq := uint64(1); seq <= 4000; seq++ { // in group commits
		wait, err := s.AppendForwardAsync("up/0", seq, rec)
		if err != nil {
			t.Fatal(err)
		}
		waits = append(waits, wait)
		seqs = append(seqs, seq)
	}
	for _, wait := range waits {
		if err := wait.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	free.Store(floor - 1<<20) // less the file's few free pages
	if err := s.AppendForward("up/0", 4001, rec); !errors.Is(err, ErrLowSpace) {
		t.Fatalf("append below the floor, the file full: %v, want ErrLowSpace", err)
	}
	if err := s.DeleteForward("up/0", seqs); err != nil {
		t.Fatal(err)
	}
	for seq := uint64(4001); seq <= 4100; seq++ { // 100 KB into 4 MB of free pages
		if err := s.AppendForward("up/0", seq, rec); err != nil {
			t.Fatalf("append %d into the file's free pages: %v", seq, err)
		}
	}
	if err := s.AppendForward("up/0", 5000, bytes.Repeat([]byte("r"), 8<<20)); !errors.Is(err, ErrLowSpace) {
		t.Fatalf("an append larger than the free pages: %v, want ErrLowSpace", err)
	}
}

// TestNoFloor: MinFreeBytes 0 never refuses, whatever the filesystem
// says.
func TestNoFloor(t *testing.T) {
	var free, now atomic.Int64
	s := floorStore(t, 0, &free, &now)
	if err := s.AppendForward("up/0", 1, []byte("r")); err != nil || s.SpaceLow() || s.Health().Failing {
		t.Fatalf("without a floor: %v, low %v, health %+v", err, s.SpaceLow(), s.Health())
	}
}

// TestFloorAtOpen: a store opened on a disk already below its floor
// reports it at once, before any append.
func TestFloorAtOpen(t *testing.T) {
	var free, now atomic.Int64
	free.Store(1 << 20)
	s := floorStore(t, 8<<20, &free, &now)
	if h := s.Health(); !s.SpaceLow() || !h.Failing || !strings.Contains(h.Err, "min_free_bytes") {
		t.Fatalf("opened below the floor: low %v, health %+v", s.SpaceLow(), h)
	}
}
