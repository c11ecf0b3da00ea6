package cluster

import (
	"context"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// The standing of a group in owner mode (docs/design.md, "Groups:
// grants", standing). Every reply of the grant script, a claim's or a
// look's, says of each ring its count (every grant held, used or not)
// and when its oldest count leaves; a gateway keeps that in its grant
// entry of the group, and answers a standing from it until the ring's
// bucket of that reply ends: within one bucket no count leaves a ring,
// so what changed since is other gateways' claims alone. A standing
// after that runs a look (one script call), at most one at a time per
// group on a gateway (the others wait for it): at most about one look
// per bucket of the group's shortest window (T/B) per group and
// gateway, instead of one per standing asked.
//
// A window's Remaining is N less the ring's count at the reply, plus
// this gateway's unused grant (which the count holds): at most N less
// what the whole cluster admitted within the window ending at the
// reply's instant, at most T/B before; at least this gateway's unused
// grant. A refused message's retry-after is the refusing claim's (the
// verdict's, docs/device-feedback.md), or a look's for the message.

// groupStanding fills s with the standing of the group's windows under
// gq, for a message of size bytes (refused or not) at now: from this
// gateway's grant entry of the group while what it holds answers (see
// above; allocation-free), else from a look at its grant rings, which
// writes nothing. While Redis is away: the failure policy's
// (Limiter.StandingAt).
func (o *Owner) groupStanding(groupKey string, gq devicelimit.Quota, size int, refused bool, now devicelimit.Tick, s *devicelimit.Standing) {
	s.N = 0
	var one [1]devicelimit.Limit
	ls := limitsOf(gq, &one)
	if devicelimit.ValidateLimits(ls, o.Buckets()) != nil {
		return
	}
	if o.shared.health.skip() {
		o.shared.localStanding(groupKey, "", gq, "", gq, size, refused, now, s)
		return
	}
	var needs [devicelimit.MaxWindows]int64
	if refused {
		for i, l := range ls {
			needs[i] = int64(l.Units(max(size, 1)))
		}
	}
	if gs := o.grantEntry(groupKey); gs != nil {
		if o.cachedStanding(gs, ls, size, &needs, now, s) {
			return
		}
		if o.shared.health.skip() { // its look failed
			o.shared.localStanding(groupKey, "", gq, "", gq, size, refused, now, s)
			return
		}
	}
	keys := make([]string, len(ls))
	base := o.prefix + "gg:{" + groupKey + "}"
	var seen [2]int
	for i, l := range ls {
		keys[i] = windowKeyOf(base, "", l.Unit, seen[l.Unit])
		seen[l.Unit]++
	}
	res, err := o.look(keys, ls, &needs, now)
	if err != nil {
		o.shared.health.failed(err)
		o.shared.localStanding(groupKey, "", gq, "", gq, size, refused, now, s)
		return
	}
	var none [devicelimit.MaxWindows]int64
	fillLook(s, ls, res, &none)
}

// grantEntry returns this gateway's grant entry of the group key, or
// nil (a standing makes none).
func (o *Owner) grantEntry(key string) *groupGrants {
	o.grants.mu.RLock()
	defer o.grants.mu.RUnlock()
	return o.grants.m[key]
}

// cachedStanding fills s from gs when gs is a grant entry on ls, for
// a message of size bytes needing needs (0: admitted): from what it
// holds, else after a look that it keeps (one at a time: a standing
// that finds a look under way waits for it). It reports false when gs
// cannot answer (another grant, or dropped) or the look failed.
func (o *Owner) cachedStanding(gs *groupGrants, ls []devicelimit.Limit, size int, needs *[devicelimit.MaxWindows]int64, now devicelimit.Tick, s *devicelimit.Standing) bool {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	var at int64
	for {
		if gs.dropped || !gs.fits(ls) {
			return false
		}
		at = o.grantNow(now)
		// A refusal still running for messages this large: the
		// decision's verdict took its retry-after (groupVerdict).
		if gs.answer(needs, needs[0] > 0 && at < gs.shut && size >= gs.shutSize, at, s) {
			return true
		}
		if !gs.looking {
			break
		}
		gs.cond.Wait()
		if o.shared.health.skip() { // the look waited for failed
			return false
		}
	}
	gs.looking = true
	gen, keys := gs.gen, append([]string(nil), gs.keys[:gs.n]...)
	gs.mu.Unlock()
	res, err := o.look(keys, ls, needs, now)
	gs.mu.Lock()
	gs.looking = false
	gs.cond.Broadcast()
	if err != nil {
		o.shared.health.failed(err)
		return false // groupStanding falls back: health.skip
	}
	if gs.gen == gen && !gs.dropped && gs.fits(ls) { // no claim's reply came in meanwhile
		gs.note(res, needs, at)
		if gs.answer(needs, needs[0] > 0 && at < gs.shut && size >= gs.shutSize, at, s) {
			return true
		}
	}
	var none [devicelimit.MaxWindows]int64
	fillLook(s, ls, res, &none)
	return true
}

// look runs the grant script's look on the rings keys of the windows
// ls at now, with the units needs of a refused message (0 else). The
// reply is seven integers a ring.
func (o *Owner) look(keys []string, ls []devicelimit.Limit, needs *[devicelimit.MaxWindows]int64, now devicelimit.Tick) ([]int64, error) {
	var clock any = ""
	if o.grants.explicit {
		clock = int64(now) / 1000
	}
	args := append(make([]any, 0, 1+9*len(ls)), clock)
	for i, l := range ls {
		args = append(args, l.N, l.Window.Microseconds(), o.Buckets(), -1, needs[i], 0, 0, 0, 0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	res, err := grantScript.Run(ctx, o.rdb, keys, args...).Int64Slice()
	if err == nil && len(res) != 7*len(ls) {
		err = errBadReply
	}
	return res, err
}

// fillLook fills s from a look's reply res on ls, this gateway's unused
// grant on each window being left.
func fillLook(s *devicelimit.Standing, ls []devicelimit.Limit, res []int64, left *[devicelimit.MaxWindows]int64) {
	s.N = 0
	for i, l := range ls {
		r := res[7*i : 7*i+7]
		s.Add(devicelimit.WindowStanding{Limit: l, Remaining: remaining(l, r[4], left[i]), Reset: time.Duration(r[5]) * time.Microsecond})
	}
}

// remaining is what a window of l has left, its ring counting count
// units of which this gateway holds left unused.
func remaining(l devicelimit.Limit, count, left int64) int {
	return int(min(max(int64(l.N)-count+left, 0), int64(l.N)))
}

// needs returns the units a message of size bytes needs in each window.
func (gs *groupGrants) needs(size int) (n [devicelimit.MaxWindows]int64) {
	for i := range gs.n {
		n[i] = int64(gs.ls[i].Units(size))
	}
	return n
}

// unused returns this gateway's unused grant on each window at at (gs.mu
// held): none once its span has ended.
func (gs *groupGrants) unused(at int64) (left [devicelimit.MaxWindows]int64) {
	if at < gs.until {
		for i := range gs.n {
			left[i] = gs.w[i].left
		}
	}
	return left
}

// note keeps what a claim's or look's reply res, sent at at, says of
// each ring (gs.mu held): its count, and until the ring's bucket ends
// when its oldest count leaves; or, for a window without room for the
// units needs (of a refused message), when they fit again.
func (gs *groupGrants) note(res []int64, needs *[devicelimit.MaxWindows]int64, at int64) {
	gs.noted = at
	for i := range gs.n {
		w, r, l := &gs.w[i], res[7*i:7*i+7], gs.ls[i]
		w.count = r[4]
		if needs[i] > 0 && r[4]+needs[i] > int64(l.N) {
			w.retry, w.retryNeed, w.fresh = at+1000*r[5], needs[i], 0
			continue
		}
		length, b := time.Duration(l.Window.Microseconds()), int(max(r[6], 1))
		end := int64(bucketStart(bucketAt(devicelimit.Tick(r[3]), b, length)+1, b, length)) - r[3]
		w.oldest, w.fresh = 0, at+1000*end
		if r[4] > 0 {
			w.oldest = at + 1000*r[5]
			w.fresh = min(w.fresh, w.oldest)
		}
	}
}

// answer fills s from what gs holds, at at, for a message needing the
// units needs of each window (0: admitted), when that answers (gs.mu
// held): a window the decision refused it on a running refusal of
// (shut) tells that refusal's retry-after, as the verdict did
// (groupVerdict); a window too full for a refused message by the counts
// held needs a retry-after still running, a refusal's for as many
// units or more; any other, counts still fresh. Allocation-free.
func (gs *groupGrants) answer(needs *[devicelimit.MaxWindows]int64, shut bool, at int64, s *devicelimit.Standing) bool {
	left := gs.unused(at)
	var ws [devicelimit.MaxWindows]devicelimit.WindowStanding
	for i := range gs.n {
		w, l := &gs.w[i], gs.ls[i]
		ws[i] = devicelimit.WindowStanding{Limit: l, Remaining: remaining(l, w.count, left[i])}
		// The refusing claim's retry-after of this window, from now.
		shutFor := gs.shut - int64(gs.no.RetryAfter) + int64(gs.no.Windows[i].RetryAfter) - at
		switch {
		case shut && gs.no.Windows[i].RetryAfter > 0 && shutFor > 0:
			ws[i].Reset = time.Duration(shutFor)
		case needs[i] > 0 && int64(ws[i].Remaining) < needs[i]:
			if at >= w.retry || needs[i] > w.retryNeed {
				return false
			}
			ws[i].Reset = time.Duration(w.retry - at)
		case at >= w.fresh:
			return false
		case w.count > 0:
			ws[i].Reset = time.Duration(w.oldest - at)
		}
	}
	s.N = 0
	for i := range gs.n {
		s.Add(ws[i])
	}
	return true
}
