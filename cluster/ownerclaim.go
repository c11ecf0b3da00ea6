package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/devicelimit"
)

func ctxBackground() context.Context { return context.Background() }

// errClaimLost reports a claim another gateway overtook before it
// settled.
var errClaimLost = errors.New("another gateway claimed the device meanwhile")

// get returns the device's state once its claim has ended, claiming it
// first when this gateway has no state for it (now: the decision's
// instant). The claim may have failed (Redis down, overtaken): the
// caller checks d.state.
func (o *Owner) get(device string, now devicelimit.Tick) *owned {
	sh := o.shard(device)
	sh.mu.RLock()
	d := sh.m[device]
	sh.mu.RUnlock()
	if d == nil {
		sh.mu.Lock()
		if d = sh.m[device]; d == nil {
			d = &owned{device: device, ready: make(chan struct{}), landed: make(chan struct{})}
			sh.m[device] = d
			sh.mu.Unlock()
			o.runClaim(d, now)
		} else {
			sh.mu.Unlock()
		}
	}
	if !d.settled.Load() {
		<-d.ready
	}
	return d // the caller checks its state under d.mu
}

// Claim makes this gateway the device's owner ahead of its first
// decision (at its connection), so that the gateway it was on releases
// it and closes its session there. It returns once the claim ended.
func (o *Owner) Claim(device string) error {
	d := o.get(device, o.clock.Now())
	d.mu.Lock()
	ok := d.state == stReady
	d.mu.Unlock()
	if !ok {
		o.forget(d)
		return fmt.Errorf("claim %q: %w", device, errClaimLost)
	}
	return nil
}

// forget drops d from the map, if it is still d there.
func (o *Owner) forget(d *owned) {
	sh := o.shard(d.device)
	sh.mu.Lock()
	if sh.m[d.device] == d {
		delete(sh.m, d.device)
	}
	sh.mu.Unlock()
}

// runClaim claims d's device and ends d's claiming state.
func (o *Owner) runClaim(d *owned, now devicelimit.Tick) {
	err := o.claim(d, now)
	d.mu.Lock()
	if err != nil {
		d.state = stLost
		o.log.Warn("device not claimed; its decisions follow the failure policy", "device", d.device, "err", err.Error())
	} else {
		d.state = stReady
	}
	d.mu.Unlock()
	d.settled.Store(true)
	close(d.ready)
}

// claim runs the claim script, waits for a live previous owner's
// release (at most the gateway TTL), settles, and installs the device's
// windows in the table with the lease it could not account for charged
// at the instant the claim settled.
func (o *Owner) claim(d *owned, now devicelimit.Tick) error {
	o.stats.claims.Add(1)
	begin := time.Now()
	key := o.recordKey(d.device)
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	v, err := claimScript.Run(ctx, o.rdb, []string{key}, o.id).Slice()
	cancel()
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	if len(v) != 6 {
		return errBadReply
	}
	epoch := v[1].(int64)
	c, _ := v[2].(string)
	lm, lb := v[3].(int64), v[4].(int64)
	if v[0].(int64) == 1 {
		if c, lm, lb, err = o.waitRelease(d.device, key, v[5].(string), epoch); err != nil {
			return err
		}
	}
	saved, err := decodeCheckpoint(c)
	if err != nil {
		o.log.Error("device's checkpoint in redis unreadable; its windows start empty", "device", d.device, "err", err.Error())
		saved = nil
	}
	at := now.Add(time.Since(begin))
	o.table.Reset(d.device)
	wins := make([]win, 0, len(saved))
	for _, sw := range saved {
		w := sw.w
		units := 0
		if sw.quota() {
			units = int(min(lm, infinite))
			if sw.unit == devicelimit.Bytes {
				units = int(min(lb, infinite))
			}
		}
		if units > 0 {
			o.stats.charges.Add(1)
			w = charged(sw.w, sw.has, units, sw.n, o.table.Buckets(), sw.length, at)
		}
		if w.Length > 0 && w.Total() > 0 {
			if err := o.table.Restore(sw.key(d.device), w); err != nil {
				o.log.Error("window of a checkpoint not restored", "device", d.device, "err", err.Error())
			}
		}
		wins = append(wins, sw.win)
	}
	d.mu.Lock()
	d.epoch, d.wins, d.durWins = epoch, wins, len(wins)
	d.usedM, d.usedB, d.capM, d.capB = 0, 0, 0, 0
	d.mu.Unlock()
	return nil
}

// waitRelease settles a claim on a device prev may still decide for.
// A prev whose liveness key is gone has fenced itself: the claim
// settles at once. A live one is asked to release the device and
// waited for until it has, or until its liveness TTL (kept in its key:
// a gateway configured with another TTL is waited for by its own) has
// passed since the request: by then prev has read the request at a
// renewal, or fenced itself. It returns the checkpoint and the lease
// left to charge.
func (o *Owner) waitRelease(device, key, prev string, epoch int64) (string, int64, int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), controlTimeout)
	ttlMs, err := o.ctl.Get(ctx, o.prefix+"gw:"+prev).Int64()
	cancel()
	switch {
	case errors.Is(err, redis.Nil):
	case err != nil:
		return "", 0, 0, fmt.Errorf("read the liveness of gateway %s: %w", prev, err)
	default:
		if err := o.askRelease(device, prev, max(time.Duration(ttlMs)*time.Millisecond, o.ttl)); err != nil {
			return "", 0, 0, err
		}
	}
	ctx, cancel = context.WithTimeout(context.Background(), controlTimeout)
	defer cancel()
	v, err := settleScript.Run(ctx, o.ctl, []string{key}, o.id, epoch).Slice()
	if err != nil {
		return "", 0, 0, fmt.Errorf("settle: %w", err)
	}
	if len(v) != 4 || v[0].(int64) != 1 {
		return "", 0, 0, errClaimLost
	}
	c, _ := v[1].(string)
	return c, v[2].(int64), v[3].(int64), nil
}

// askRelease asks the live gateway prev to release device and waits
// until it has, or ttl and a tenth have passed since the request.
func (o *Owner) askRelease(device, prev string, ttl time.Duration) error {
	o.stats.waits.Add(1)
	ch := make(chan struct{}, 1)
	o.wmu.Lock()
	o.waiters[device] = ch
	o.wmu.Unlock()
	defer func() {
		o.wmu.Lock()
		if o.waiters[device] == ch {
			delete(o.waiters, device)
		}
		o.wmu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), controlTimeout)
	pipe := o.ctl.Pipeline()
	pipe.SAdd(ctx, o.prefix+"rq:{"+prev+"}", device)
	pipe.Publish(ctx, o.prefix+"gwc:"+prev, "q"+device)
	_, err := pipe.Exec(ctx)
	cancel()
	if err != nil {
		// Not asked: the claim fails, and the next decision claims again
		// (the record names prev as the owner to ask).
		return fmt.Errorf("ask gateway %s to release: %w", prev, err)
	}
	// The request is in Redis once the pipeline answered: within the
	// TTL prev reads it at a liveness renewal, or fences itself.
	timer := time.NewTimer(ttl + ttl/10)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
	case <-o.stop:
		return errClaimLost
	}
	return nil
}
