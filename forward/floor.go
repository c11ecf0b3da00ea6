package forward

import (
	"errors"
	"time"
)

// ErrLowSpace is wrapped, with ErrFull, in Append's error when the data
// file's disk is at its free-space floor (persist.min_free_bytes) under
// RefuseNew.
var ErrLowSpace = errors.New("the data file's disk is at its free-space floor")

// floorSlack is the part of the log a forwarder under DropOldest drops
// ahead once the disk is at its floor (an eighth, at least 64 KiB): the
// pages it frees in the data file take the appends that arrive before
// the next trim, so that the file does not grow.
func floorSlack(backlog int64) int64 { return max(backlog/8, 64<<10) }

// atFloor applies the overflow policy when the data file's disk is at
// its free-space floor (Log.SpaceLow): under RefuseNew the message is
// refused (ErrFull and ErrLowSpace, counted in Refused and LowSpace);
// under DropOldest the log stops growing: from now on it is kept a
// slack below what it holds (floorBound), the oldest messages dropped
// to make room (counted in DroppedOldest and LowSpace), and the message
// goes on to the log. Called before each append.
func (f *Forwarder) atFloor() error {
	if !f.log.SpaceLow() {
		return nil
	}
	if f.cfg.Overflow == RefuseNew {
		n := f.refused.Add(1)
		f.lowSpace.Add(1)
		now := time.Now().UnixNano()
		if last := f.refusedLogged.Load(); now-last >= int64(10*time.Second) && f.refusedLogged.CompareAndSwap(last, now) {
			f.slog.Warn("the data file's disk is at its free-space floor; new messages refused (overflow: refuse_new)", "refused_so_far", n)
		}
		return errFloor
	}
	if f.floorBound.Load() == 0 {
		f.lowerFloorBound()
	}
	return nil
}

// lowerFloorBound keeps the log, under DropOldest, a slack below what
// it holds, or below its bound once trimmed to it, and wakes the pump to
// trim. While a trim to the bound is still to come, the bound stays.
func (f *Forwarder) lowerFloorBound() {
	for {
		cur := f.floorBound.Load()
		b := f.backlogBytes.Load()
		if cur > 0 && b > cur {
			break // the pump has yet to trim to it
		}
		if f.floorBound.CompareAndSwap(cur, max(b-floorSlack(b), 1)) {
			break
		}
	}
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// appendFailed handles an append the store refused because the disk is
// at its floor (the commit found it before atFloor could): counted as
// refused under RefuseNew, returned with ErrFull and ErrLowSpace; under
// DropOldest (the message is not acknowledged, so the device sends it
// again) the log is bounded lower, so that the next append finds room.
func (f *Forwarder) appendFailed(err error) error {
	if !f.log.SpaceLow() {
		return err
	}
	if f.cfg.Overflow == RefuseNew {
		f.refused.Add(1)
		f.lowSpace.Add(1)
		return errors.Join(errFloor, err)
	}
	f.lowerFloorBound()
	return err
}

var errFloor = errors.Join(ErrFull, ErrLowSpace)

// bound returns the most record bytes the log may hold under
// DropOldest (0: no bound): MaxBytes, or less while the disk is at its
// floor. Once the disk is above its floor again the log may grow again.
// Called from Run's goroutine only.
func (f *Forwarder) bound() (bound int64, floor bool) {
	bound = f.live.Load().MaxBytes // one reading: SetLive may change it
	if fb := f.floorBound.Load(); fb > 0 {
		if !f.log.SpaceLow() {
			f.floorBound.Store(0)
		} else if bound == 0 || fb < bound {
			return fb, true
		}
	}
	return bound, false
}
