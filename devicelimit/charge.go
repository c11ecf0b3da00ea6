package devicelimit

import "sync/atomic"

// A crash charge stands in for admissions a crash made the table forget.
// A gateway that did not shut down cleanly restores each window as of its
// last snapshot; what it admitted after that snapshot is lost, at most
// the quota's limit per device, at instants no later than some tick C
// (the snapshot's instant plus what one snapshot interval and its write
// could take). Charging every device as if it had used its whole quota at
// C keeps the invariant across the crash: an admission at t after the
// restart is counted against everything in (t-T, t], lost admissions
// included, because those all lie at or before C and the charge at C is
// counted until C leaves the window. A crash can therefore cost a device
// the rest of one window, never give it extra quota, and crashes one
// after another do not add up: each start charges again, at the C of the
// last snapshot that was written.

// charge is the table's crash charge; see SetCrashCharge.
type charge struct{ at atomic.Int64 }

// SetCrashCharge charges every device of the table, those restored and
// those without a window yet, as if it had been admitted up to its quota's
// limit at tick at. Each window is charged at its first decision (AllowAt
// or PeekAt) under its quota then: its count in at's bucket is raised so
// that the window holds the limit, and its window length is the quota's.
// A window whose length has already passed at is not charged. at may be
// later than the decisions that follow (a restart quicker than the bound
// on the crash): the window then reaches ahead to at, and is refused until
// at's bucket leaves it. 0 clears the charge. Call it before the table
// decides, after restoring the snapshot.
func (t *Table) SetCrashCharge(at Tick) { t.charge.at.Store(int64(at)) }

// CrashCharge returns the tick set by SetCrashCharge, 0 when none.
func (t *Table) CrashCharge() Tick { return Tick(t.charge.at.Load()) }

// applyCharge charges r, held under its shard's lock, at tick at for
// quota q as of now, and marks it charged. It reports whether it added
// counts.
func (r rec) applyCharge(q Limit, at, now Tick, buckets int) bool {
	r.setFlags(r.flags() | flagCharged)
	if r.length() != q.Window {
		r.recut(q.Window, now, buckets)
	}
	slots := buckets + 1
	nbC := bucketOf(at, buckets, q.Window)
	if nbC < bucketOf(now, buckets, q.Window)-int64(buckets) {
		return false // at's bucket has left every window reaching now
	}
	if nbC > r.head() {
		r.advance(nbC, slots)
	}
	if nbC < r.head()-int64(buckets) {
		return false
	}
	add := q.N - r.total()
	if add <= 0 {
		return false
	}
	slot := int(nbC % int64(slots))
	r.setCount(slot, r.count(slot)+add)
	r.setTotal(r.total() + add)
	return true
}

// chargedPeek is PeekAt's decision for a device without a window while a
// crash charge at tick at is in force: the window it would get is full
// until at's bucket leaves it.
func chargedPeek(q Limit, at, now Tick, buckets int) (Decision, bool) {
	nbC := bucketOf(at, buckets, q.Window)
	if nbC < bucketOf(now, buckets, q.Window)-int64(buckets) {
		return Decision{}, false
	}
	// Expiring when the bucket after the ring's last leaves it.
	expires := bucketStart(nbC+int64(buckets)+1, buckets, q.Window)
	return Decision{Count: q.N, Limit: q.N, RetryAfter: expires.Sub(now)}, true
}
