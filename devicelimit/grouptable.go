package devicelimit

import "unsafe"

// AllowGroupAt decides whether device may publish a message of size
// bytes at now in topic class class ("" for its own quota) under q,
// when it is in the group whose key is groupKey (GroupKey: callers
// keep it, so a decision allocates nothing) under gq: the device's
// windows and the group's are decided together, under both shards'
// locks (taken in shard order), so no window, the device's or the
// group's, ever holds more than its limit.
//
// When q and gq are both enforced, or both in shadow mode, the message
// is admitted only when every window of both admits it, and counted in
// every one. When one is in shadow mode, the enforced one decides
// first, alone; only a message it admits (and counts) is decided in the
// shadow one's windows, and counted there when they admit it: what the
// enforced windows let through stays within their limits, and the
// shadow windows count what they would admit. The Decision is the
// refusing window's, Group set when it is the group's (the caller lets
// the message through when that part is in shadow mode), or, admitted,
// the device's first window's.
func (t *Table) AllowGroupAt(device, class string, q Quota, groupKey string, gq Quota, size int, now Tick) GroupDecision {
	var dOne, gOne [1]Limit
	dls, gls := limitsInto(q, &dOne), limitsInto(gq, &gOne)
	dp := part{stem: device, class: class, lease: t.lease.on && !q.Shadow && !noLease(class)}
	gp := part{stem: groupKey, lease: t.lease.on && !gq.Shadow}
	for k, ls := range [2][]Limit{dls, gls} {
		if bad := t.invalidLimit(ls); bad != -1 {
			d := GroupDecision{Group: k == 1}
			if bad >= 0 {
				d.Limit = ls[bad].N
			}
			return d
		}
	}
	dp.s, _ = t.shard(device)
	gp.s, _ = t.shard(groupKey)
	first, second := dp.s, gp.s
	if uintptr(unsafe.Pointer(first)) > uintptr(unsafe.Pointer(second)) {
		first, second = second, first
	}
	first.mu.Lock()
	if second != first {
		second.mu.Lock()
	}
	o := OrderOf(q, gq)
	if o == BothParts {
		// Both decided, so a refusal names the part that admits last.
		dok := t.prepare(&dp, dls, size, now, true, false)
		if t.prepare(&gp, gls, size, now, true, false) && dok {
			t.commit(&dp, dls, size, now)
			t.commit(&gp, gls, size, now)
		}
	} else {
		a, b, als, bls := &dp, &gp, dls, gls // the enforced part first
		if o == GroupFirst {
			a, b, als, bls = &gp, &dp, gls, dls
		}
		if t.prepare(a, als, size, now, true, len(als) == 1) {
			if len(als) > 1 {
				t.commit(a, als, size, now)
			}
			if t.prepare(b, bls, size, now, true, len(bls) == 1) && len(bls) > 1 {
				t.commit(b, bls, size, now)
			}
		}
	}
	if second != first {
		second.mu.Unlock()
	}
	first.mu.Unlock()
	return groupDecision(&dp, &gp)
}

// GroupOrder is how AllowGroupAt decides a device's part of a message
// and its group's; every other decider of both parts (a peek, a shared
// limiter, an owner deciding the group in Redis) follows it.
type GroupOrder uint8

const (
	// BothParts: both parts enforced, or both in shadow mode. Both are
	// decided, and the message counted in either only when both admit.
	BothParts GroupOrder = iota
	// DeviceFirst: the group in shadow mode. The device's part decides
	// alone; the group's is decided only for a message it admitted.
	DeviceFirst
	// GroupFirst: the device in shadow mode. The group's part decides
	// alone; the device's is decided only for a message it admitted.
	GroupFirst
)

// OrderOf returns the order of a device under q in a group under gq.
func OrderOf(q, gq Quota) GroupOrder {
	switch {
	case q.Shadow == gq.Shadow:
		return BothParts
	case gq.Shadow:
		return DeviceFirst
	}
	return GroupFirst
}

// Peeked turns the verdicts of the two parts, each peeked alone, into
// those AllowGroupAt would reach in order o: the part decided second is
// not decided (gv zero; a device's part taken as admitting) when the
// first refused.
func (o GroupOrder) Peeked(dv, gv Verdict) (Verdict, Verdict) {
	switch {
	case o == DeviceFirst && !dv.Allowed:
		gv = Verdict{}
	case o == GroupFirst && !gv.Allowed:
		dv = Verdict{Allowed: true}
	}
	return dv, gv
}

// groupDecision sums a group decision up (see CombineGroup).
func groupDecision(dp, gp *part) GroupDecision {
	return CombineGroup(dp.verdict(), gp.verdict())
}

// CombineGroup sums up a group decision (AllowGroupAt) from the verdict
// on the device's windows, dv, and on its group's, gv, each Allowed
// when all its windows admitted the message (counted or not), gv.N 0
// when the group's windows were not decided: the device's first
// window's decision when both admitted, else the refusing part's (the
// group's when only it refused; a too-large message's first; else the
// one that admits last), with Group set when it is the group's.
func CombineGroup(dv, gv Verdict) GroupDecision {
	d := combineGroup(dv, gv)
	// The part admitted and counted may be acted on while the other
	// refuses (shadow mode): its lease is the message's.
	d.Lease = newerLease(dv.Lease, gv.Lease)
	return d
}

func combineGroup(dv, gv Verdict) GroupDecision {
	if dv.Allowed && gv.Allowed {
		return GroupDecision{Decision: dv.Decision()}
	}
	byGroup := dv.Allowed
	if !dv.Allowed && gv.N > 0 && !gv.Allowed && !dv.TooLarge {
		byGroup = gv.TooLarge || gv.RetryAfter > dv.RetryAfter
	}
	if byGroup {
		d := gv.Decision()
		d.Allowed = false
		return GroupDecision{Decision: d, Group: true}
	}
	d := dv.Decision()
	d.Allowed = false
	return GroupDecision{Decision: d}
}

// limitsInto returns q's windows, its one message window built in one
// (so as not to allocate).
func limitsInto(q Quota, one *[1]Limit) []Limit {
	if q.NWindows == 0 {
		one[0] = Limit{Unit: Messages, N: q.Limit, Window: q.Window}
		return one[:]
	}
	return q.Windows[:min(max(q.NWindows, 0), MaxWindows)]
}

// PeekGroupAt returns the verdict a message of size bytes would get in
// the windows of the group whose key is groupKey under gq, changing
// nothing: the group's status.
func (t *Table) PeekGroupAt(groupKey string, gq Quota, size int, now Tick) Verdict {
	var one [1]Limit
	return t.PeekAllAt(groupKey, "", limitsInto(gq, &one), size, now)
}
