package cluster

import (
	"context"

	"github.com/devicegate/devicegate/devicelimit"
)

// AllowGroupAt decides a message of device in class under q together
// with its group's windows (groupKey, devicelimit.GroupKey) under gq,
// in one script call: the decision contract of devicelimit.Table's
// AllowGroupAt (both enforced or both in shadow mode: all windows or
// none; one in shadow mode: the enforced part first, the other only
// when it admitted), atomic inside Redis. Redis Cluster cannot take it
// (the keys of one call must share a slot): the configuration refuses
// groups there.
func (l *Limiter) AllowGroupAt(device, class string, q devicelimit.Quota, groupKey string, gq devicelimit.Quota, size int, now devicelimit.Tick) devicelimit.GroupDecision {
	r := l.pool.Get().(*request)
	if d, done := l.fillGroup(r, device, class, q, groupKey, gq, size); done {
		l.pool.Put(r)
		return d
	}
	if l.health.skip() {
		l.pool.Put(r)
		return l.fallbackGroup(device, class, q, groupKey, gq, size, now)
	}
	if !l.send(r, device) {
		return l.fallbackGroup(device, class, q, groupKey, gq, size, now)
	}
	d := devicelimit.CombineGroup(r.res, r.gres)
	l.pool.Put(r)
	return d
}

// fallbackGroup decides a group decision under the failure policy.
func (l *Limiter) fallbackGroup(device, class string, q devicelimit.Quota, groupKey string, gq devicelimit.Quota, size int, now devicelimit.Tick) devicelimit.GroupDecision {
	if l.policy == PolicyLocal {
		l.health.fallbacks.Add(1)
		return l.local.AllowGroupAt(device, class, q, groupKey, gq, size, now)
	}
	return devicelimit.GroupDecision{Decision: l.fallback(device, class, q.Limits(), size, now)}
}

// fillGroup sets r's keys and arguments for a group decision (see
// AllowGroupAt): the enforced part first when one is in shadow mode,
// the second then conditional. It returns the decision, and true, when
// none needs Redis: invalid windows, or a message too large for a part
// decided first or with the other. A second part too large is decided
// here (r.tooLarge) and the first asked alone.
func (l *Limiter) fillGroup(r *request, device, class string, q devicelimit.Quota, groupKey string, gq devicelimit.Quota, size int) (devicelimit.GroupDecision, bool) {
	ls, gls := q.Limits(), gq.Limits()
	if d, done := l.precheck(ls, 0); done {
		return devicelimit.GroupDecision{Decision: d}, true
	}
	if d, done := l.precheck(gls, 0); done {
		return devicelimit.GroupDecision{Decision: d, Group: true}, true
	}
	r.reset()
	order := devicelimit.OrderOf(q, gq)
	r.cond, r.groupFirst = order != devicelimit.BothParts, order == devicelimit.GroupFirst
	copy(r.ls[:], ls)
	copy(r.gls[:], gls)
	type part struct {
		base, class string
		ls          []devicelimit.Limit
		group       bool
	}
	a, b := part{l.windowKey(device), class, ls, false}, part{l.windowKey(groupKey), "", gls, true}
	if r.groupFirst {
		a, b = b, a
	}
	va, aTL := devicelimit.TooLargeVerdict(a.ls, size)
	vb, bTL := devicelimit.TooLargeVerdict(b.ls, size)
	switch {
	case aTL || bTL && !r.cond:
		v, byGroup := va, a.group
		if !aTL {
			v, byGroup = vb, b.group
		}
		return devicelimit.GroupDecision{Decision: v.Decision(), Group: byGroup}, true
	case bTL:
		r.tooLarge, r.second = true, vb
	}
	l.fillPart(r, a.base, a.class, a.ls, size, true, 0)
	r.na = r.n
	if !r.tooLarge {
		l.fillPart(r, b.base, b.class, b.ls, size, true, 0)
	}
	return devicelimit.GroupDecision{}, false
}

// evalGroupAt is a group decision taken synchronously at clock, an
// explicit time in microseconds (for tests, which cannot move Redis's
// clock).
func (l *Limiter) evalGroupAt(ctx context.Context, device, class string, q devicelimit.Quota, groupKey string, gq devicelimit.Quota, size int, clock int64) (devicelimit.GroupDecision, error) {
	var r request
	if d, done := l.fillGroup(&r, device, class, q, groupKey, gq, size); done {
		return d, nil
	}
	r.setGroups(0)
	v, err := windowScript.Run(ctx, l.rdb, r.keys[:r.n], append(r.args[:6*r.n:6*r.n], clock)...).Int64Slice()
	if err == nil {
		err = r.decode(v)
	}
	if err != nil {
		return devicelimit.GroupDecision{}, err
	}
	return devicelimit.CombineGroup(r.res, r.gres), nil
}
