package cluster

import (
	"context"

	"github.com/devicegate/devicegate/devicelimit"
)

// giveBack takes out of gs the unused rests it can give back (gs.mu
// held): the rest of a grant whose span has ended, else that of the
// grant in its span (the newer: one give-back a window), which no
// decision may use afterwards. It returns the script's arguments for a
// call that claims nothing and gives them back at each ring's own
// latest instant, and the units by devicelimit.Unit (none: nothing to
// send).
func (gs *groupGrants) giveBack(buckets int) ([]any, [2]int64) {
	args := []any{0} // each ring at its own latest instant
	var units [2]int64
	for i := range gs.n {
		w, l := &gs.w[i], gs.ls[i]
		back, k, b := w.back, w.backK, w.backB
		if w.left > 0 && gs.until != 0 {
			back, k, b = w.left, w.dated, w.b
		}
		units[l.Unit] += back
		args = append(args, l.N, l.Window.Microseconds(), buckets, 0, 0, back, k, l.Window.Microseconds(), b)
		w.left, w.back = 0, 0
	}
	gs.until = 0
	return args, units
}

// sendBack gives back units of gs's group in one script call (args from
// giveBack), counted once Redis has them.
func (o *Owner) sendBack(ctx context.Context, keys []string, args []any, units [2]int64) error {
	if units[devicelimit.Messages] == 0 && units[devicelimit.Bytes] == 0 {
		return nil
	}
	if err := grantScript.Run(ctx, o.rdb, keys, args...).Err(); err != nil {
		return err
	}
	o.countBack(units)
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

// returnGrants gives back the rests of this gateway's grants at Close,
// one script call per group (wanting nothing), until ctx ends or a call
// fails: no decision of this gateway uses them any more (its fence has
// passed; a rest is taken out under the group's lock, so a decision
// still under way finds none and claims anew, counted).
func (o *Owner) returnGrants(ctx context.Context) {
	o.grants.mu.RLock()
	all := make([]*groupGrants, 0, len(o.grants.m))
	for _, gs := range o.grants.m {
		all = append(all, gs)
	}
	o.grants.mu.RUnlock()
	for _, gs := range all {
		gs.mu.Lock()
		args, units := gs.giveBack(o.Buckets())
		keys := gs.keys[:gs.n:gs.n]
		gs.mu.Unlock()
		if err := o.sendBack(ctx, keys, args, units); err != nil {
			o.log.Warn("group grants not given back at stop; they leave the windows by themselves", "err", err.Error())
			return
		}
	}
}
