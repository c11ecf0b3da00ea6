package cluster

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// Sizing of group grants (docs/design.md, "Groups: grants"): a first grant
// is grantFirst messages' units of each window; a grant used up within
// its span doubles the next, one that ends its span with more than half
// unused halves it; none is more than N/grantCapDiv of a window, and the
// script gives none more than a quarter of the window's room.
const (
	grantFirst  = 4
	grantCapDiv = 8
)

// grantTable holds this gateway's grants on the groups of the devices it
// decides, by group key. An entry whose grant's span has ended and that
// no decision used for grantIdle is dropped, its rest given back
// (ownergroupback.go): a templated group (one per device) does not keep
// an entry per device it ever saw.
type grantTable struct {
	mu sync.RWMutex
	m  map[string]*groupGrants
	// explicit: grants run on the decisions' ticks, which the script
	// gets as its time (tests inject the clock); else on Redis's TIME,
	// and a grant's span is timed on this process's monotonic clock.
	explicit bool
}

// groupGrants is this gateway's grant on one group's windows.
type groupGrants struct {
	mu    sync.Mutex
	key   string // the group's key in grantTable
	base  string
	n     int
	ls    [devicelimit.MaxWindows]devicelimit.Limit
	keys  [devicelimit.MaxWindows]string
	w     [devicelimit.MaxWindows]grantWin
	until int64 // the span's end (grantNow's clock); 0: no grant
	// claims counts this gateway's claims on the group: the first and
	// every legacyEvery-th also ask whether the per-message script's
	// window of the group exists (legacy), warned at most once a
	// legacyWarnEvery.
	claims int
	legacy string
	warned time.Time
	// shut is the instant (grantNow's clock) until which messages of
	// shutSize bytes or more are refused here with no, the verdict of
	// Redis's last refusal: the group is full for them until then, and a
	// refusal need not cost a script call each.
	shut     int64
	shutSize int
	no       devicelimit.Verdict
	args     []any
	// used is the instant (grantNow's clock) of the last decision on
	// the entry; dropped: the sweep took it out of grantTable, a
	// decision that found it there looks again.
	used    int64
	dropped bool
	// The standing cache (ownergroupstanding.go): noted is the instant
	// of the last reply noted, gen counts the claims noted, looking is
	// set while a standing's look is in flight (the group's other
	// standings wait on cond, L = &mu, for it).
	noted   int64
	gen     uint64
	looking bool
	cond    sync.Cond
}

// grantWin is the grant on one window of a group.
type grantWin struct {
	left, got, want int64
	dated, b        int64 // the bucket the grant is dated in; the ring's B
	count           int64 // the ring's count right after the claim
	// back is the unused rest of a grant whose span has ended, to give
	// back with the next claim: units, dated bucket, the ring's T (µs)
	// and B.
	back, backK, backT, backB int64
	// What the last claim or look said of the ring, for the standing
	// (ownergroupstanding.go), on grantNow's clock: count (above) and
	// the instant its oldest count leaves are the ring's until fresh
	// (0: unknown); retry is when a message of retryNeed units fits
	// again, as a refusal said.
	oldest, fresh    int64
	retry, retryNeed int64
}

// grantsOf returns this gateway's grant state of the group key.
func (o *Owner) grantsOf(key string) *groupGrants {
	t := &o.grants
	t.mu.RLock()
	gs := t.m[key]
	t.mu.RUnlock()
	if gs != nil {
		return gs
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if gs = t.m[key]; gs == nil {
		if t.m == nil {
			t.m = make(map[string]*groupGrants)
		}
		k := strings.Clone(key) // key does not leak: see groupPart
		gs = &groupGrants{key: k, base: o.prefix + "gg:{" + key + "}", legacy: o.prefix + "w:{" + key + "}"}
		gs.cond.L = &gs.mu
		t.m[k] = gs
	}
	return gs
}

// grantNow is the instant grants are timed at: the decision's tick with
// an injected clock, else the monotonic clock (a decision's tick may be
// older than the instant it is taken, after a wait).
func (o *Owner) grantNow(now devicelimit.Tick) int64 {
	if o.grants.explicit {
		return int64(now) - int64(now)%1000 // the script's microsecond
	}
	return o.mono()
}

// groupVerdict decides a message of size bytes on the group's windows
// and counts it: on this gateway's grant while it lasts, else
// after claiming a new one in Redis; by the failure policy when Redis
// fails. Allocation-free within a grant.
func (o *Owner) groupVerdict(g groupPart, size int, now devicelimit.Tick) devicelimit.Verdict {
	var one [1]devicelimit.Limit
	ls := limitsOf(g.q, &one)
	gs := o.grantsOf(g.key)
	gs.mu.Lock()
	for gs.dropped {
		gs.mu.Unlock()
		gs = o.grantsOf(g.key)
		gs.mu.Lock()
	}
	defer gs.mu.Unlock()
	gs.fit(ls)
	at := o.grantNow(now)
	gs.used = at
	gs.expire(at)
	if gs.take(size, at) {
		return gs.admitted()
	}
	if at < gs.shut && size >= gs.shutSize {
		v := gs.no
		v.RetryAfter = time.Duration(gs.shut - at)
		v.Windows[v.Refused].RetryAfter = v.RetryAfter
		return v
	}
	if !o.shared.health.skip() {
		v, err := o.claimGrant(gs, size, now)
		if err == nil {
			o.shared.health.ok()
			return v
		}
		o.shared.health.failed(err)
	}
	o.stats.grantFailed.Add(1)
	return policyVerdict(o.shared.fallback(g.key, "", ls, size, now), len(ls))
}

// fit makes gs a grant on the windows ls: other windows (an override,
// a reload) drop the grant, whose units stay counted in Redis.
func (gs *groupGrants) fit(ls []devicelimit.Limit) {
	if gs.fits(ls) {
		return
	}
	gs.n, gs.until, gs.shut = len(ls), 0, 0
	var seen [2]int
	for i, l := range ls {
		gs.ls[i], gs.w[i] = l, grantWin{}
		gs.keys[i] = windowKeyOf(gs.base, "", l.Unit, seen[l.Unit])
		seen[l.Unit]++
	}
}

// fits reports whether gs is a grant on the windows ls.
func (gs *groupGrants) fits(ls []devicelimit.Limit) bool {
	same := gs.n == len(ls)
	for i := 0; same && i < len(ls); i++ {
		same = gs.ls[i] == ls[i]
	}
	return same
}

// expire ends the grant once its span has passed at: its unused rest
// waits to be given back with the next claim (only now: no admission
// can use it any more), and an ample rest halves the next grant.
func (gs *groupGrants) expire(at int64) {
	if gs.until == 0 || at < gs.until {
		return
	}
	for i := range gs.n {
		w := &gs.w[i]
		if w.left > 0 {
			w.back, w.backK, w.backT, w.backB = w.left, w.dated, gs.ls[i].Window.Microseconds(), w.b
			if 2*w.left > w.got {
				w.want = max(w.want/2, 1)
			}
		}
		w.left = 0
	}
	gs.until = 0
}

// take admits a message of size bytes on the grant when every window's
// rest holds it.
func (gs *groupGrants) take(size int, at int64) bool {
	if at >= gs.until {
		return false
	}
	for i := range gs.n {
		if gs.w[i].left < int64(gs.ls[i].Units(size)) {
			return false
		}
	}
	for i := range gs.n {
		gs.w[i].left -= int64(gs.ls[i].Units(size))
	}
	return true
}

// admitted is the verdict of a message admitted on the grant: a
// window's count is the ring's as of the claim less the grant's rest
// (what the group admitted, as this gateway last saw it, at most).
func (gs *groupGrants) admitted() devicelimit.Verdict {
	v := devicelimit.Verdict{Allowed: true, Refused: -1, N: gs.n}
	for i := range gs.n {
		w, l := &gs.w[i], gs.ls[i]
		c := int(max(w.count-w.left, 0))
		v.Windows[i] = devicelimit.Decision{Allowed: true, Count: c, Limit: l.N, Remaining: max(l.N-c, 0), Unit: l.Unit}
	}
	return v
}

// claimGrant claims a new grant on gs's windows in one script call (gs.mu
// held: the group's other decisions here wait for it and then use it),
// giving back the rest of the last one, and decides the message of size
// bytes on it. The rest of a grant still in its span is dropped (it
// stays counted in Redis until it leaves the window).
func (o *Owner) claimGrant(gs *groupGrants, size int, now devicelimit.Tick) (devicelimit.Verdict, error) {
	at := o.grantNow(now)
	grow := gs.until != 0 // used up within its span
	args := gs.args[:0]
	var back [2]int64 // units given back with the claim, by unit
	if o.grants.explicit {
		args = append(args, int64(now)/1000)
	} else {
		args = append(args, "")
	}
	for i := range gs.n {
		w, l := &gs.w[i], gs.ls[i]
		need := int64(l.Units(size))
		switch {
		case w.want == 0:
			w.want = grantFirst * need
		case grow && w.left < need:
			w.want *= 2
		}
		w.want = min(max(w.want, need), max(int64(l.N)/grantCapDiv, need))
		args = append(args, l.N, l.Window.Microseconds(), o.Buckets(), w.want, need, w.back, w.backK, w.backT, w.backB)
		back[l.Unit] += w.back
		w.back, w.left = 0, 0
	}
	gs.args, gs.until = args, 0
	o.stats.grants.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	keys := gs.keys[:gs.n]
	if gs.claims%legacyEvery == 0 {
		keys = append(keys[:gs.n:gs.n], gs.legacy)
	}
	gs.claims++
	res, err := grantScript.Run(ctx, o.rdb, keys, args...).Int64Slice()
	cancel()
	switch {
	case err != nil:
		return devicelimit.Verdict{}, err
	case len(res) == 1 && res[0] == -1:
		return devicelimit.Verdict{}, fmt.Errorf("%w: a grant key of %s", ErrBadWindow, gs.base)
	case len(res) == 7*gs.n+1:
		o.legacyFound(gs, res[7*gs.n] == 1)
	case len(res) != 7*gs.n:
		return devicelimit.Verdict{}, errBadReply
	}
	o.countBack(back)
	var needs [devicelimit.MaxWindows]int64 // a refused message's units: its full windows' replies are retry-afters
	if res[0] <= 0 {
		needs = gs.needs(size)
	}
	gs.gen++
	gs.note(res, &needs, at)
	if res[0] <= 0 {
		o.stats.grantRefused.Add(1)
		gs.no = gs.refused(res, size)
		gs.shut, gs.shutSize = at+int64(gs.no.RetryAfter), size
		return gs.no, nil
	}
	span := time.Duration(1 << 62)
	for i := range gs.n {
		w, r := &gs.w[i], res[7*i:7*i+7]
		w.got, w.dated, w.b = r[0], r[1], r[6]
		o.stats.grantUnits[gs.ls[i].Unit].Add(uint64(w.got))
		w.left = w.got - int64(gs.ls[i].Units(size))
		span = min(span, time.Duration(r[2]-r[3])*time.Microsecond)
	}
	gs.until = at + int64(span)
	return gs.admitted(), nil
}

// How often a claim asks for the per-message script's window of its
// group, and how often finding it is logged.
const (
	legacyEvery     = 256
	legacyWarnEvery = time.Minute
)

// legacyFound logs, at most once a legacyWarnEvery a group, that the
// per-message script's window of gs's group exists: in owner mode only
// a gateway of an earlier build writes it (or one did before this
// gateway started, within the last window), and the group's admissions
// are then split over two windows.
func (o *Owner) legacyFound(gs *groupGrants, found bool) {
	if !found || time.Since(gs.warned) < legacyWarnEvery {
		return
	}
	gs.warned = time.Now()
	name := strings.TrimSuffix(strings.TrimPrefix(gs.legacy, o.prefix+"w:{\x00"), "}")
	o.log.Error("a gateway of an earlier build decides this group per message (its per-message window was written within the last window): "+
		"the group's admissions are split between that window and the grants, up to twice its quota; stop every gateway to upgrade a cluster with groups",
		"group", name)
}

// refused is the verdict of a claim Redis refused (res its reply) for
// a message of size bytes: a window without room for it has its
// retry-after, the others none.
func (gs *groupGrants) refused(res []int64, size int) devicelimit.Verdict {
	v := devicelimit.Verdict{N: gs.n, Refused: 0}
	for i := range gs.n {
		l, r := gs.ls[i], res[7*i:7*i+7]
		d := devicelimit.Decision{Count: int(r[4]), Limit: l.N, Remaining: max(l.N-int(r[4]), 0), Unit: l.Unit}
		if r[4]+int64(l.Units(size)) > int64(l.N) {
			d.RetryAfter = time.Duration(r[5]) * time.Microsecond
		}
		v.Windows[i] = d
		if d.RetryAfter > 0 && d.RetryAfter >= v.RetryAfter {
			v.RetryAfter, v.Refused = d.RetryAfter, i
		}
	}
	return v
}
