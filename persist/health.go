package persist

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Health is whether the store can still write, as its writes found it.
type Health struct {
	// Failing reports that the last write (a snapshot, a deferred
	// message, an override, a delete) failed, or that appends are
	// refused for the free-space floor (Options.MinFreeBytes).
	Failing bool
	// Err is the last failure's message while Failing.
	Err string
	// Since is when the current streak of failures began; zero while
	// healthy.
	Since time.Time
	// Failures counts the failed writes since Open.
	Failures uint64
}

// health records the outcome of every write. Safe for concurrent use;
// a success while healthy costs one atomic load.
type health struct {
	failing atomic.Bool
	mu      sync.Mutex
	h       Health
	// smallest is, during a streak, the fewest bytes a failed write of
	// known size carried (-1: none of known size failed). A full disk
	// fails the writes that need new pages while small ones still fit
	// in free pages: only a write at least that large ends the streak.
	smallest int
}

// unknownSize is the size of a write that carries no records of its
// own to count (a snapshot, an override): its success ends a streak
// only when no write of known size failed.
const unknownSize = -1

// note records the outcome of a write of size bytes of records
// (unknownSize when it has none to count). A write refused because the
// store is closed says nothing about the disk and is not recorded. A
// success ends a streak of failures only if it is as large as the
// smallest failed write of known size: a deletion that succeeds on a
// full disk says nothing of the appends that fail. The first failure of
// a streak and the success that ends it are logged, once each.
func (h *health) note(err error, size int, now func() time.Time, log *slog.Logger, path string) {
	if err == nil && !h.failing.Load() || errors.Is(err, ErrClosed) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		if !h.h.Failing || !(h.smallest < 0 && size == unknownSize || h.smallest >= 0 && size >= h.smallest) {
			return // smaller than the writes that fail: says nothing of them
		}
		log.Info("data file writes succeed again", "path", path, "failing_for", now().Sub(h.h.Since).Round(time.Millisecond).String())
		h.h.Failing, h.h.Err, h.h.Since = false, "", time.Time{}
		h.failing.Store(false)
		return
	}
	if !h.h.Failing {
		h.smallest = unknownSize
	}
	if size != unknownSize && (h.smallest < 0 || size < h.smallest) {
		h.smallest = size
	}
	if !h.h.Failing {
		h.h.Since = now()
		log.Error("data file writes failing: snapshots, deferrals and override changes are not stored; /healthz answers 503 until a write succeeds",
			"path", path, "err", err)
	}
	h.h.Failing, h.h.Err = true, err.Error()
	h.h.Failures++
	h.failing.Store(true)
}

func (h *health) get() Health {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.h
}

// Health returns whether the store's writes are failing, since when and
// why. The gateway reports it on /healthz and in its metrics.
//
// While the room left for the data file is below Options.MinFreeBytes
// (SpaceLow), Health is failing too, with the room in Err: appends are
// refused then.
func (s *Store) Health() Health {
	h := s.health.get()
	if s.space.isLow() {
		if !h.Failing {
			h.Failing, h.Since = true, s.space.lowSince()
		}
		h.Err = s.space.err().Error()
	}
	return h
}
