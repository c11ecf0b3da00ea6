package devicelimit

import "strings"

// Collect hands out what changed since the last Collect (the first time:
// every window that gained a count since it was made or restored), for
// a store to write: fn(device, enc) for every window that gained a count, with enc
// its encoding as by Window.MarshalBinary, and fn(device, nil) for every
// window evicted or reset after an earlier Collect handed it out (a store
// may hold it and should delete it). A device may come twice, a deletion
// first; apply the calls in order.
//
// fn runs with one shard locked at a time: it must be quick (copy the
// bytes, which are valid only during the call) and must not call the
// Table. Decisions on other shards go on meanwhile, and a shard is locked
// only for the time its own changes take to encode. Collect returns the
// number of windows and deletions handed out. Concurrent Collects are
// serialized by the shard locks but interleave: use one collector.
func (t *Table) Collect(fn func(device string, enc []byte)) int {
	return t.CollectLeases(func(device string, enc []byte, _ LeaseMark) { fn(device, enc) })
}

// CollectLeases is Collect that also hands out, with each window, what
// its snapshot records of its lease (zero without one): the store
// writes it in the same transaction as the window. With a deletion
// (enc nil) the mark holds the deleted window's incarnation (0 if it
// had no lease): a lease write of a later incarnation of the same key
// may commit before the deletion does, and must survive it; and, as
// recorded, all its leases could have admitted: the deleted incarnation
// admits nothing more, so its lease closes (a reset window's was
// open), and no lease write of it, taken before the deletion, can open
// it again whichever commits first. A window with an
// open lease is looked at again by the next collection, and handed out
// only when it admitted since (or its lease closes): once idleLimit
// collections in a row found it admitting nothing, its lease is closed:
// it gives up the rest (the next admission takes a new lease) and the
// mark records the whole lease, so a crash after that snapshot charges
// it nothing. A quiet device's window is thus written when it
// publishes, as without leases, not at every snapshot.
func (t *Table) CollectLeases(fn func(device string, enc []byte, m LeaseMark)) int {
	n := 0
	var buf []byte
	var again []string
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for _, g := range s.gone {
			fn(g.key, nil, LeaseMark{Inc: g.inc, Recorded: g.held})
			n++
		}
		clear(s.gone)
		s.gone = s.gone[:0]
		again = again[:0]
		// hand hands out the window under device (owned: the string is
		// the dirty list's, kept as it is for the next collection).
		hand := func(device string, ref uint32, owned bool) {
			r := s.rec(ref)
			f := r.flags()
			if f&flagDirty == 0 {
				return // listed twice: evicted, then back and dirty again
			}
			f = f&^flagDirty | flagStored
			var m LeaseMark
			if t.lease.on {
				if ls := s.lease(ref); ls.inc != 0 {
					// Idle since the last collection (no admission
					// cleared the flag): nothing to write unless its
					// lease closes now.
					revisit, closed := f&flagIdle != 0, false
					if revisit {
						if ls.idle++; ls.idle >= t.lease.idleLimit(r.length()) {
							ls.adm = max(ls.adm, ls.cap) // idle long enough: close the lease
							revisit, closed = false, true
						}
					}
					f &^= flagIdle
					if ls.cap > ls.adm {
						f |= flagIdle | flagDirty
						if !owned {
							device = strings.Clone(device)
						}
						again = append(again, device)
					}
					if revisit {
						r.setFlags(f)
						return
					}
					if closed || ls.cap <= ls.adm {
						// Only a closed lease's mark is written: an open
						// one's charge is bounded by its lease writes,
						// which hold the window's counts (SettleLease).
						m = LeaseMark{Inc: ls.inc, Recorded: ls.adm}
					}
				}
			}
			r.setFlags(f)
			buf = appendRec(buf[:0], r, t.buckets)
			fn(device, buf, m)
			n++
		}
		if !s.collected {
			// The first Collect: the shard kept no list until now, so
			// every window is looked at once.
			s.collected = true
			for j := range s.index.slots {
				if sl := &s.index.slots[j]; sl.meta != 0 {
					hand(sl.keyString(), sl.ref(), false)
				}
			}
		}
		for _, device := range s.dirty {
			ref, ok := s.index.get(device, hashString(device))
			if !ok {
				continue // evicted since: it is in gone, or never stored
			}
			hand(device, ref, true)
		}
		clear(s.dirty) // drop the strings, keep the capacity
		s.dirty = append(s.dirty[:0], again...)
		s.mu.Unlock()
	}
	return n
}

// Dirty returns the number of windows changed since the last Collect and
// the deletions waiting for it (an upper bound: a device may be listed
// twice).
func (t *Table) Dirty() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += len(s.dirty) + len(s.gone)
		s.mu.Unlock()
	}
	return n
}

// appendRec appends the encoding of Window.MarshalBinary of r to b.
func appendRec(b []byte, r rec, buckets int) []byte {
	return appendWindow(b, r.length(), r.head(), recCounts{r, buckets + 1})
}

// recCounts are a record's counts, oldest first.
type recCounts struct {
	r     rec
	slots int
}

func (c recCounts) len() int        { return c.slots }
func (c recCounts) at(i int) uint64 { return uint64(c.r.countAt(i, c.slots)) }

// countAt returns the count of the bucket at position pos from the
// oldest of the window's slots.
func (r rec) countAt(pos, slots int) int {
	k := r.head() - int64(slots-1) + int64(pos)
	if k < 0 {
		return 0
	}
	return r.count(int(k % int64(slots)))
}
