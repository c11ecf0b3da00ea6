package persist

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// space is the free-space floor (Options.MinFreeBytes): the room left
// for the data file is what its filesystem has free plus the file's own
// free pages (bbolt reuses them before it grows the file). Below the
// floor, appends (forward log records, deferred messages) are refused
// with ErrLowSpace, and the store's health fails, so that the disk never
// fills: deletions, snapshots and leases still go. Safe for concurrent
// use.
type space struct {
	dir   string
	floor int64 // 0: no floor
	log   *slog.Logger
	// freeInFile returns the bytes in the file's free pages, as of the
	// last commit.
	freeInFile func() int64
	// free is how many bytes dir's filesystem has free (diskFree when
	// nil).
	free func(dir string) (int64, bool)
	now  func() time.Time

	low atomic.Bool

	mu       sync.Mutex
	lastRoom int64     // at the last check
	since    time.Time // when the room went below the floor; zero while above
}

// check asks the filesystem for its free space and reports whether
// writing need bytes would take the room below the floor (refuse). It
// records whether the room is low: below the floor by that measure, or,
// once low, until the room is a margin above the floor (floorMargin), so
// that the state does not flap with each append and deletion.
func (sp *space) check(need int64) (refuse bool) {
	if sp.floor <= 0 {
		return false
	}
	room, ok := sp.room()
	if !ok {
		return false
	}
	refuse = room-need < sp.floor
	low := refuse || sp.low.Load() && room < sp.floor+floorMargin(sp.floor)
	now := sp.now()
	sp.mu.Lock()
	sp.lastRoom = room
	switch {
	case low && sp.since.IsZero():
		sp.since = now
		sp.log.Error("free space for the data file below persist.min_free_bytes: appends (forwarded messages, deferrals) refused or the oldest dropped as forward overflow says; /healthz answers 503",
			"dir", sp.dir, "room", room, "min_free_bytes", sp.floor)
	case !low && !sp.since.IsZero():
		sp.log.Info("free space for the data file above persist.min_free_bytes again", "dir", sp.dir, "room", room,
			"low_for", now.Sub(sp.since).Round(time.Millisecond).String())
		sp.since = time.Time{}
	}
	sp.mu.Unlock()
	sp.low.Store(low)
	return refuse
}

// floorMargin is how far above the floor the room must be for a low
// store to be low no more: a sixteenth of the floor, at least 1 MiB.
func floorMargin(floor int64) int64 { return max(floor/16, 1<<20) }

// isLow reports whether the room is below the floor. Above it, the
// answer is the last commit's (each commit that writes records asks the
// filesystem, one statfs): an append costs no system call. Below it,
// the filesystem is asked again, so that room made by others (a
// deletion, the operator) is seen at once.
func (sp *space) isLow() bool {
	if sp.floor <= 0 || !sp.low.Load() {
		return false
	}
	sp.check(0)
	return sp.low.Load()
}

// lowSince returns when the room went below the floor, zero while it is
// above.
func (sp *space) lowSince() time.Time {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.since
}

// err is the error of an append refused below the floor.
func (sp *space) err() error {
	sp.mu.Lock()
	room := sp.lastRoom
	sp.mu.Unlock()
	return fmt.Errorf("%w: %d bytes left for the data file in %q (free on its filesystem and free in the file), below persist.min_free_bytes %d",
		ErrLowSpace, room, sp.dir, sp.floor)
}

// Room returns the room left for the data file, what the floor
// (Options.MinFreeBytes) is compared with: the bytes free on its
// filesystem plus those in the file's free pages. ok is false where the
// free space cannot be known.
func (s *Store) Room() (room int64, ok bool) { return s.space.room() }

func (sp *space) room() (int64, bool) {
	ask := sp.free
	if ask == nil {
		ask = diskFree
	}
	free, ok := ask(sp.dir)
	if !ok {
		return 0, false
	}
	return free + sp.freeInFile(), true
}

// SpaceLow reports whether the room left for the data file (free space
// on its filesystem plus the file's free pages) was below
// Options.MinFreeBytes at the last commit that wrote records, and still
// is: appends are then refused with ErrLowSpace.
// Always false without a floor, or where the free space cannot be
// known.
func (s *Store) SpaceLow() bool { return s.space.isLow() }
