package devicelimit

import "time"

// The sliding window. A window of length T is a ring of S = B+1 slots,
// one per bucket of width T/B. A decision at tick now, in bucket nb,
// counts every slot: the buckets nb-B..nb. They cover (now-T, now] and
// more: the oldest bucket is partly expired, and counting it whole is
// what makes the invariant hold. Proof: an admission at t sees every
// earlier admission in (t-T, t], because floor((t-T)*B/T) = nb-B; it is
// admitted only if fewer than N were counted, so no interval of length T
// ever holds more than N admissions. A ring of only B slots would forget
// the partly expired bucket and admit up to 2N in less than T.
//
// The price: the counted span is up to T*(1+1/B) long, so a device that
// sends evenly faster than N per T*(1+1/B) is refused about 1/B of its
// messages. One sending at that rate or slower is never refused.

// advance moves the window's newest bucket to nb, expiring the slots it
// passes. nb must not be older than the head.
func (r rec) advance(nb int64, slots int) {
	head := r.head()
	gap := nb - head
	if gap <= 0 {
		return
	}
	if gap >= int64(slots) {
		clear(r.b[recHeader:])
	} else {
		total := r.total()
		slot := int(head % int64(slots))
		for ; gap > 0; gap-- {
			if slot++; slot == slots {
				slot = 0
			}
			total -= r.count(slot)
			r.setCount(slot, 0)
		}
		r.setTotal(total)
	}
	r.setHead(nb)
}

// recut re-cuts a window for a new length: each bucket's count moves to
// the new bucket that holds the old bucket's last tick, so a message is
// counted no earlier than it was sent, expires no earlier under the new
// length than it should, and at most one new bucket later (or, when the
// old head bucket ends after now, in the ring's oldest bucket). Counts
// whose new bucket is out of every new window reaching now are dropped. The window count stays the
// same (buckets is the table's).
//
// Moving every count to the newest bucket, as an earlier version did, is
// safe too, but a device whose quota alternates between two window
// lengths (an override set and lifted, or gateways that disagree) would
// see its counts pushed forward at every change and never expire.
func (r rec) recut(window time.Duration, now Tick, buckets int) {
	slots := buckets + 1
	oldLen, head := r.length(), r.head()
	var counts [MaxBuckets + 1]uint32 // by position, oldest first
	for pos := range slots {
		if k := head - int64(buckets) + int64(pos); k >= 0 {
			counts[pos] = uint32(r.count(int(k % int64(slots))))
		}
	}
	// The new bucket of old bucket k only grows with k: the head's is the
	// newest.
	newBucket := func(k int64) int64 { return bucketOf(bucketStart(k+1, buckets, oldLen)-1, buckets, window) }
	cur := bucketOf(now, buckets, window)
	nb := max(cur, newBucket(head))
	clear(r.b[recHeader:])
	total := 0
	for pos := range slots {
		c := int(counts[pos])
		if c == 0 {
			continue
		}
		j := newBucket(head - int64(buckets) + int64(pos))
		if j < cur-int64(buckets) {
			continue // out of every new window reaching now
		}
		// The ring ends at nb, which may be ahead of now (the old head
		// bucket ends later): a count older than the ring's oldest
		// bucket but still within a window of now goes there, later.
		j = max(j, nb-int64(buckets))
		slot := int(j % int64(slots))
		r.setCount(slot, r.count(slot)+c)
		total += c
	}
	r.setHead(nb)
	r.setLength(window)
	r.setTotal(total)
}

// decideN advances the window to now and, when count is set and the
// window has room, counts a message that counts n (1 in a message
// window, its bytes in a byte window; n <= q.N): the window has room when
// its total plus n is within the limit, and the RetryAfter of a refusal
// is when enough has expired for n more.
func (r rec) decideN(q Limit, now Tick, c *cut, n int, count bool) Decision {
	buckets := c.buckets
	slots := buckets + 1
	if r.length() != q.Window {
		r.recut(q.Window, now, buckets)
	}
	nb := c.bucketOf(now, q.Window)
	if head := r.head(); nb < head {
		// The caller's tick is older than the newest bucket (a clock
		// read just before another goroutine's, or a re-cut that put
		// the counts in a later bucket): decide as of the head. A
		// RetryAfter still counts from now, the caller's instant.
		nb = head
	} else {
		r.advance(nb, slots)
	}
	total := r.total()
	slot := int(nb % int64(slots))
	if total+n <= q.N {
		if count {
			r.setCount(slot, r.count(slot)+n)
			total += n
			r.setTotal(total)
		}
		return Decision{Allowed: count, Count: total, Limit: q.N, Remaining: q.N - total}
	}
	// Over the limit: find the oldest bucket whose expiry leaves room
	// for n; the window admits again when it leaves. The oldest bucket,
	// nb-buckets, sits in the slot after nb's.
	k := nb - int64(buckets) + int64(r.slotsToAdmit(slot, slots, total+n-q.N-1, q.N-n+1))
	at := c.bucketStart(k+int64(slots), q.Window)
	return Decision{Count: total, Limit: q.N, RetryAfter: at.Sub(now)}
}

// slotsToAdmit returns the position, counted from the oldest bucket, of
// the bucket whose expiry leaves room for a message: the oldest bucket k
// with (counts newer than k) < limit, equivalently (counts up to k) >
// excess = total - limit. slot is the newest bucket's slot. For a
// message counting n, limit is the window's limit - n + 1 and excess
// total + n - (its limit) - 1.
//
// Walking from the oldest end is quick when the counts are spread out
// (a steady flood); from the newest end when they sit in the newest
// buckets (a burst). The walk goes both ways at once and stops at the
// first answer: at most about half the slots, whatever the shape.
func (r rec) slotsToAdmit(slot, slots, excess, limit int) int {
	oldest := slot + 1 // slot of position 0
	if oldest == slots {
		oldest = 0
	}
	at := func(pos int) int { // slot of the position pos from the oldest
		if s := oldest + pos; s < slots {
			return s
		} else {
			return s - slots
		}
	}
	prefix, suffix := 0, 0
	for lo, hi := 0, slots-1; ; lo, hi = lo+1, hi-1 {
		if prefix += r.count(at(lo)); prefix > excess {
			return lo
		}
		if suffix += r.count(at(hi)); suffix >= limit {
			return hi
		}
	}
}
