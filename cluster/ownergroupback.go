package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// A grant entry whose grant's span has ended, unused for grantIdle, is
// dropped by the sweep, which runs every grantSweepEvery.
const (
	grantIdle       = time.Minute
	grantSweepEvery = 10 * time.Second
)

// grantBack is the unused rest of one group's grant on its way back to
// Redis: its rings, the script's nine arguments per ring, and its units
// by devicelimit.Unit.
type grantBack struct {
	keys  []string
	args  []any
	units [2]int64
}

// giveBack takes out of gs the unused rests it can give back (gs.mu
// held): the rest of a grant whose span has ended, else that of the
// grant in its span (the newer: one give-back a window), which no
// decision may use afterwards. ok is false when there is none.
func (gs *groupGrants) giveBack(buckets int) (b grantBack, ok bool) {
	b.keys, b.args = gs.keys[:gs.n:gs.n], make([]any, 0, 9*gs.n)
	for i := range gs.n {
		w, l := &gs.w[i], gs.ls[i]
		back, k, bk := w.back, w.backK, w.backB
		if w.left > 0 && gs.until != 0 {
			back, k, bk = w.left, w.dated, w.b
		}
		b.units[l.Unit] += back
		ok = ok || back > 0
		b.args = append(b.args, l.N, l.Window.Microseconds(), buckets, 0, 0, back, k, l.Window.Microseconds(), bk)
		w.left, w.back = 0, 0
	}
	gs.until = 0
	return b, ok
}

// sendBack gives back the rests bs in Redis, claiming nothing, at each
// ring's own latest instant: on one Redis server one script call per
// batchMax groups, on Redis Cluster one per group, pipelined (a group's
// rings share its slot; groups do not). Units are counted once Redis
// has them; it returns the first error.
func (o *Owner) sendBack(ctx context.Context, bs []grantBack) error {
	var first error
	if o.multi {
		chunks(len(bs), func(lo, hi int) {
			if first != nil {
				return
			}
			var keys []string
			args := []any{0}
			for _, b := range bs[lo:hi] {
				keys, args = append(keys, b.keys...), append(args, b.args...)
			}
			if first = backReply(grantScript.Run(ctx, o.rdb, keys, args...), len(keys)); first == nil {
				for _, b := range bs[lo:hi] {
					o.countBack(b.units)
				}
			}
		})
		return first
	}
	cmds := evalEach(ctx, o.rdb, grantScript, len(bs), func(i int) []string { return bs[i].keys },
		func(i int) []any { return append([]any{0}, bs[i].args...) })
	for i, cmd := range cmds {
		err := backReply(cmd, len(bs[i].keys))
		if err == nil {
			o.countBack(bs[i].units)
		} else if first == nil {
			first = err
		}
	}
	return first
}

// backReply is the error of a give-back's script call over n rings:
// the call's, or a reply that is not seven integers a ring (-1 alone: a
// ring's key holds something else, and nothing was written).
func backReply(cmd *redis.Cmd, n int) error {
	res, err := cmd.Int64Slice()
	switch {
	case err != nil:
		return err
	case len(res) == 1 && res[0] == -1:
		return fmt.Errorf("%w: a group grant key holds something else", ErrBadWindow)
	case len(res) != 7*n:
		return errBadReply
	}
	return nil
}

// countBack counts units given back to Redis, by devicelimit.Unit.
func (o *Owner) countBack(units [2]int64) {
	for u, n := range units {
		if n > 0 {
			o.stats.grantBack[u].Add(uint64(n))
		}
	}
}

// returnGrants gives back the rests of this gateway's grants at Close
// (until ctx ends): no decision of this gateway uses them any more (its
// fence has passed; a rest is taken out under the group's lock, so a
// decision still under way finds none and claims anew, counted).
func (o *Owner) returnGrants(ctx context.Context) {
	var bs []grantBack
	for _, gs := range o.grantEntries() {
		gs.mu.Lock()
		if b, ok := gs.giveBack(o.Buckets()); ok {
			bs = append(bs, b)
		}
		gs.mu.Unlock()
	}
	if err := o.sendBack(ctx, bs); err != nil {
		o.log.Warn("group grants not given back at stop; they leave the windows by themselves", "err", err.Error())
	}
}

// grantEntries returns the entries of the grant table now.
func (o *Owner) grantEntries() []*groupGrants {
	o.grants.mu.RLock()
	defer o.grants.mu.RUnlock()
	all := make([]*groupGrants, 0, len(o.grants.m))
	for _, gs := range o.grants.m {
		all = append(all, gs)
	}
	return all
}

// sweeper drops the idle grant entries every grantSweepEvery (at once
// when nudged), on the monotonic clock, or with an injected clock
// (grantTable.explicit) at the latest instant a decision was taken at.
func (o *Owner) sweeper() {
	defer o.wg.Done()
	tick := time.NewTicker(grantSweepEvery)
	defer tick.Stop()
	for {
		select {
		case <-o.stop:
			return
		case <-tick.C:
		case <-o.sweepNow:
		}
		now := o.mono()
		if o.grants.explicit {
			now = 0
			for _, gs := range o.grantEntries() {
				gs.mu.Lock()
				now = max(now, gs.used)
				gs.mu.Unlock()
			}
		}
		o.dropIdleGrants(o.done, now, int64(grantIdle))
	}
}

// dropIdleGrants drops the grant entries whose grant's span has ended
// by now and that no decision used within idle (nor holds a refusal
// still running), giving their rests back first as the next claim
// would: taken out under the table's and the group's locks (a decision
// that finds such an entry looks again, makes a new one and claims), then
// sent. A rest Redis does not get (it is away) stays counted until it
// leaves the window, as a crashed gateway's. It returns the entries
// dropped.
func (o *Owner) dropIdleGrants(ctx context.Context, now, idle int64) int {
	var idles []*groupGrants
	for _, gs := range o.grantEntries() {
		gs.mu.Lock()
		gs.expire(now)
		if gs.idle(now, idle) {
			idles = append(idles, gs)
		}
		gs.mu.Unlock()
	}
	if len(idles) == 0 {
		return 0
	}
	var bs []grantBack
	dropped := 0
	t := &o.grants
	t.mu.Lock()
	for _, gs := range idles {
		gs.mu.Lock()
		if gs.idle(now, idle) { // not used since
			gs.dropped = true
			delete(t.m, gs.key)
			dropped++
			if b, ok := gs.giveBack(o.Buckets()); ok {
				bs = append(bs, b)
			}
		}
		gs.mu.Unlock()
	}
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, batchTimeout(o.timeout, len(bs)))
	defer cancel()
	if err := o.sendBack(ctx, bs); err != nil && ctx.Err() == nil {
		o.log.Warn("idle group grants not given back; they leave the windows by themselves", "err", err.Error())
	}
	return dropped
}

// idle reports whether gs's grant's span has ended (expire at now
// done), no decision used it within idle, and no refusal it holds still
// runs (gs.mu held).
func (gs *groupGrants) idle(now, idle int64) bool {
	return gs.until == 0 && now-gs.used >= idle && now >= gs.shut
}
