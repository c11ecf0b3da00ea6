package devicelimit

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// What a crash costs (lease.go). A store keeps, per window, the latest
// lease write of its incarnation (cap, and the admissions and counts
// the window had when it was written) and the latest snapshot's mark
// (the admissions its counts held). After a crash, the newer of the
// two gives the window's counts, each at the instant it was admitted,
// and units admitted after it is at most cap minus its admissions: one
// lease. Those are charged at once, at the restart's instant (or the
// last instant the crashed run could have admitted, when earlier): no
// admission of the crashed run can be later than the restart, so the
// charge expires no earlier than any of them, and a window reaching
// now keeps every other count where it was. A device publishing at its
// quota thus loses at most one lease to a crash, whatever its rate.

// StoredLease is what a store holds of a window's lease after a crash:
// the incarnation, the cap its lease writes gave, the admissions the
// latest snapshot's counts held (Recorded, of the same incarnation),
// the window's length, and the latest lease write's admissions and
// counts (Adm, and Window as Lease.Window; nil when none is stored).
type StoredLease struct {
	Inc, Cap, Recorded uint64
	Length             time.Duration
	Adm                uint64
	Window             []byte
}

// SettleLease settles the window under key after a crash, on a table
// whose snapshot is restored and before decisions start: when the
// lease write's counts are newer than the snapshot's (Adm > Recorded),
// the window is restored from them; then the units its lease could
// have admitted beyond the counts restored (Cap minus their
// admissions, at most one lease) are charged at the earlier of at (the
// latest instant the crashed run could have admitted) and now (the
// restart). It reports whether the window changed (the store must
// write it) and the units charged.
func (t *Table) SettleLease(key string, l StoredLease, at, now Tick) (changed bool, charged int, err error) {
	held := l.Recorded
	if l.Window != nil && l.Adm > l.Recorded {
		if err := t.RestoreBinary(key, l.Window); err != nil {
			return false, 0, fmt.Errorf("%w: lease of window %q: %w", ErrBadSnapshot, key, err)
		}
		t.notGone(key) // replaced, not evicted: the caller writes it
		held, changed = l.Adm, true
	}
	if l.Cap <= held {
		return changed, 0, nil
	}
	units, err := t.chargeLease(key, l.Length, int(min(l.Cap-held, MaxBytes)), min(at, now), now)
	if err != nil {
		return changed, 0, err
	}
	return changed || units > 0, units, nil
}

// notGone takes key off its shard's evicted windows (Collect), where
// replacing its restored window put it.
func (t *Table) notGone(key string) {
	s, _ := t.shardOfKey(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gone = slices.DeleteFunc(s.gone, func(g goneWindow) bool { return g.key == key })
}

// chargeLease charges the window under key units at tick at (not after
// now). A window not restored is made, of the lease's length; one
// restored keeps its length. The window's lease remembers the charge
// and its bucket, so that a refusal can tell it was caused by the
// charge alone (ChargedAt). It returns the units charged: none when at
// is out of every window reaching now (no window is made then).
func (t *Table) chargeLease(key string, length time.Duration, units int, at, now Tick) (int, error) {
	if err := validKey(key); err != nil {
		return 0, err
	}
	if length < t.minWindow || length > MaxWindow {
		return 0, fmt.Errorf("%w: lease of window %q: length %s out of range", ErrBadSnapshot, key, length)
	}
	if units <= 0 {
		return 0, nil
	}
	s, h := t.shardOfKey(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.index.find(key, h)
	if i >= 0 {
		length = s.rec(s.index.slots[i].ref()).length()
	}
	if bucketOf(at, t.buckets, length) < bucketOf(now, t.buckets, length)-int64(t.buckets) {
		return 0, nil // out of every window reaching now
	}
	if i < 0 && inBuffer(s, key) {
		key = strings.Clone(key)
	}
	r, _, _ := s.lookup(key, h, units, true)
	if r.length() == 0 {
		r.setLength(length)
		r.setHead(bucketOf(at, t.buckets, length))
	}
	total := r.total()
	units = min(units, MaxBytes-total)
	r, ref, _ := s.lookup(key, h, total+units, true) // wide enough
	nbC := bucketOf(at, t.buckets, r.length())
	// at is not after now: advancing to its bucket expires only counts
	// that no window reaching now holds.
	r.advance(nbC, t.buckets+1)
	nb := max(nbC, r.head())
	slot := int(nb % int64(t.buckets+1))
	r.setCount(slot, r.count(slot)+units)
	r.setTotal(r.total() + units)
	if r.flags()&flagDirty == 0 {
		s.markDirty(r, key)
	}
	if t.lease.on {
		ls := s.lease(ref)
		ls.charge, ls.chargeBucket = uint32(units), uint32(nb)
	}
	return units, nil
}

// ChargedAt reports whether a refusal of a message of size bytes at now
// under q, in class ("" for the device's own quota), is the crash
// charge's doing alone: every window of q that refuses it would admit
// it without the units a crash charged it (SettleLease), still in the
// window. The refusals it reports do not count toward a block. It
// changes nothing.
func (t *Table) ChargedAt(device, class string, q Quota, size int, now Tick) bool {
	if !t.lease.on {
		return false
	}
	var one [1]Limit
	ls := limitsInto(q, &one)
	s, _ := t.shard(device)
	s.mu.Lock()
	defer s.mu.Unlock()
	charged := false
	var seen [2]int
	for _, l := range ls {
		key := s.windowKey(device, class, l.Unit, seen[l.Unit])
		seen[l.Unit]++
		n := l.Units(size)
		ref, ok := s.index.get(key, hashString(key))
		if !ok || n > l.N {
			continue
		}
		r := s.rec(ref)
		if r.length() != l.Window {
			return false // re-cut since: the charge's bucket is another's
		}
		nb := max(bucketOf(now, t.buckets, l.Window), r.head())
		// The counts still in a window reaching now: none once the gap
		// passes the ring (rec.advance's shortcut; walking it would take a
		// step per bucket of an idle device's gap, and count slots twice).
		total := 0
		if nb-r.head() < int64(t.buckets+1) {
			total = r.total()
			for k := r.head() - int64(t.buckets); k < nb-int64(t.buckets); k++ {
				if k >= 0 {
					total -= r.count(int(k % int64(t.buckets+1)))
				}
			}
		}
		if total+n <= l.N {
			continue // this window admits it
		}
		ls := s.lease(ref)
		// The charge's bucket is at most the head: nb is not older.
		if ls.charge == 0 || uint32(nb)-ls.chargeBucket > uint32(t.buckets) || total-int(ls.charge)+n > l.N {
			return false
		}
		charged = true
	}
	return charged
}
