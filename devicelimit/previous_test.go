package devicelimit

import "time"

// The decision path of a quota of one window as it was before quotas of
// several windows (commit 6fc1c5d: Table.decide, shard.lookup,
// rec.decide, with the Quota of then, three fields), kept so that
// BenchmarkAllowAt compares today's AllowAt with it in one run. The
// table's structures are the same; only the code that walks them is
// the previous one.

// PreviousQuota is Quota as it was: 24 bytes, passed by value.
type PreviousQuota struct {
	Limit  int
	Window time.Duration
	Policy Policy
}

// AllowAtPrevious is the previous Table.AllowAt.
func (t *Table) AllowAtPrevious(device string, q PreviousQuota, now Tick) Decision {
	return t.decidePrevious(device, q, now, true)
}

func (t *Table) decidePrevious(device string, q PreviousQuota, now Tick, count bool) Decision {
	if q.Limit < 1 || q.Limit > MaxLimit || q.Window < t.minWindow || q.Window > MaxWindow {
		return Decision{Limit: q.Limit}
	}
	s, h := t.shard(device)
	s.mu.Lock()
	var r rec
	var ok bool
	if count {
		r, ok = s.lookupPrevious(device, h, q.Limit, true)
	} else {
		r, ok = s.peekCopy(device, h, q.Limit)
	}
	if !ok {
		s.mu.Unlock()
		return Decision{Limit: q.Limit, Remaining: q.Limit}
	}
	d := r.decidePrevious(q, now, &s.cut, count)
	if count && d.Allowed && r.flags()&flagDirty == 0 {
		r.setFlags(r.flags() | flagDirty)
		if s.collected {
			s.dirty = append(s.dirty, device)
		}
	}
	s.mu.Unlock()
	return d
}

func (s *shard) lookupPrevious(device string, h uint64, limit int, create bool) (rec, bool) {
	class := classFor(limit)
	i := s.index.find(device, h)
	switch {
	case i < 0 && !create:
		return rec{}, false
	case i < 0:
		ref := uint32(class)<<refClassShift | s.slabs[class].alloc()
		s.index.insert(device, h, ref)
		s.peak = max(s.peak, s.index.n)
		return s.rec(ref), true
	}
	slot := &s.index.slots[i]
	ref := slot.ref()
	if int(ref>>refClassShift) < class {
		old := s.rec(ref)
		s.free(ref)
		ref = uint32(class)<<refClassShift | s.slabs[class].alloc()
		slot.setRef(ref)
		r := s.rec(ref)
		copyRec(r, old)
		return r, true
	}
	return s.rec(ref), true
}

func (r rec) decidePrevious(q PreviousQuota, now Tick, c *cut, count bool) Decision {
	buckets := c.buckets
	slots := buckets + 1
	if r.length() != q.Window {
		r.recut(q.Window, now, buckets)
	}
	nb := c.bucketOf(now, q.Window)
	if head := r.head(); nb < head {
		nb = head
	} else {
		r.advance(nb, slots)
	}
	total := r.total()
	slot := int(nb % int64(slots))
	if total < q.Limit {
		if count {
			r.setCount(slot, r.count(slot)+1)
			total++
			r.setTotal(total)
		}
		return Decision{Allowed: count, Count: total, Limit: q.Limit, Remaining: q.Limit - total}
	}
	k := nb - int64(buckets) + int64(r.slotsToAdmit(slot, slots, total-q.Limit, q.Limit))
	at := c.bucketStart(k+int64(slots), q.Window)
	return Decision{Count: total, Limit: q.Limit, RetryAfter: at.Sub(now)}
}
