package devicelimit

// Leases at connect. Without them a device's first admission finds no
// lease and waits for one disk commit before it is acted on (its PUBACK
// waits). For a quiet fleet, whose devices publish a few times a minute,
// that is most of the PUBACK tail. Prelease asks a device's first leases
// when its session starts, written at once (the writer's short pause
// shares the commit among devices connecting together); the broker
// sends the CONNACK once they are durable (WaitSessionLease), so the
// device's first publish, which often follows the CONNACK at once,
// finds its lease on disk and waits for nothing.
//
// The crash bound is unchanged: a window's lease is one lease, asked
// at most L beyond its admissions (here none), and a crash charges at
// most the rest of it. What changes is who holds a lease: a device that
// connected and has not published yet holds one until its window
// admitted nothing through idleLimit collections (the lease then
// closes, and a crash after that charges it nothing), so a crash within
// that time charges it at most one lease although it published nothing.

// Prelease asks a lease for each of device's windows ls in class that
// has no open lease with room left, creating the windows it does not
// have yet (empty), and wakes the lease writer; it returns the lease
// batch to wait for (0: none asked; see WaitSessionLease). It does
// nothing without leases, for a class that is not quota
// (noLease) or for windows a decision would refuse (invalid limits).
// Call it as the device's session starts, with the quota its messages
// will be decided under; a quota in shadow mode takes no lease.
func (t *Table) Prelease(device, class string, ls []Limit, now Tick) uint32 {
	if !t.lease.on || noLease(class) || t.invalidLimit(ls) != -1 {
		return 0
	}
	s, _ := t.shard(device)
	var gen uint32
	s.mu.Lock()
	var seen [2]int
	for _, l := range ls {
		key := s.windowKey(device, class, l.Unit, seen[l.Unit])
		seen[l.Unit]++
		// Made (a new window's ring: its length and head), not counted.
		_, ref := t.decideKey(s, key, l, 1, now, true, false)
		r, le := s.rec(ref), s.lease(ref)
		if le.inc != 0 && le.cap > le.adm {
			// Its next admission is covered; the CONNACK waits for
			// that lease too while it is not durable (a session that
			// asked it just ended).
			if le.gen > t.lease.durable.Load() {
				gen = newerLease(gen, uint32(le.gen))
			}
			continue
		}
		t.askLease(s, le, key, l, 1)
		// The collections look at it until its lease closes (an open
		// lease is never swept): marked idle, the first finds it unused.
		// A window already dirty admitted since the last collection:
		// that one writes it, then looks at it again.
		if f := r.flags(); f&flagDirty == 0 {
			r.setFlags(f | flagIdle | flagStored) // a store holds its lease from now on
			s.markDirty(r, key)
		}
		gen = newerLease(gen, uint32(le.gen))
	}
	s.mu.Unlock()
	if gen != 0 {
		select {
		case t.lease.wake <- struct{}{}:
		default:
		}
	}
	return gen
}

// PreleaseQuota is Prelease for device's own windows under q (its quota
// outside any topic class), as AllowQuotaAt decides them.
func (t *Table) PreleaseQuota(device string, q Quota, now Tick) uint32 {
	if q.Shadow {
		return 0
	}
	var one [1]Limit
	return t.Prelease(device, "", limitsInto(q, &one), now)
}

// leaseHeld reports whether window ref of s holds a lease that a
// collection has still to close or write (a lease not yet durable, or
// an open one with room left): Sweep keeps it, so that an idle window's
// lease closes as documented (CollectLeases) instead of leaving a
// store an open lease that a crash would charge.
func (t *Table) leaseHeld(s *shard, ref uint32) bool {
	if !t.lease.on {
		return false
	}
	ls := s.lease(ref)
	return ls.gen > t.lease.durable.Load() || (ls.inc != 0 && ls.cap > ls.adm)
}
