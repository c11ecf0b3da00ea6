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

// errResting reports a claim not tried: Redis failed recently
// (health.skip).
var errResting = errors.New("redis failed recently; not tried")

// claimReq is a claim waiting in the queue, or for a previous owner.
type claimReq struct {
	d     *owned
	now   devicelimit.Tick // the instant of the decision (or connection)
	begin time.Time        // when it was queued
	epoch int64
	prev  string
}

// get returns the device's state once its claim has ended, claiming it
// first when this gateway has no state for it (now: the decision's
// instant). The claim may have failed (Redis down, overtaken): the
// caller checks d.state. waited reports whether it waited for the
// claim.
func (o *Owner) get(device string, now devicelimit.Tick) (d *owned, waited bool) {
	d = o.start1(device, now, false)
	if !d.settled.Load() {
		<-d.ready
		waited = true
	}
	return d, waited // the caller checks its state under d.mu
}

// start1 returns the device's state, its claim queued when this gateway
// had none, or when conn (a new connection of the device here) and the
// device was given up to another gateway (stParted).
func (o *Owner) start1(device string, now devicelimit.Tick, conn bool) *owned {
	sh := o.shard(device)
	sh.mu.RLock()
	d := sh.m[device]
	sh.mu.RUnlock()
	if d != nil && !(conn && d.parted.Load()) {
		return d
	}
	sh.mu.Lock()
	if d = sh.m[device]; d != nil && !(conn && d.parted.Load()) {
		sh.mu.Unlock()
		return d
	}
	d = &owned{device: device, ready: make(chan struct{}), landed: make(chan struct{}), gone: make(chan struct{})}
	sh.m[device] = d
	sh.mu.Unlock()
	o.stats.claims.Add(1)
	if o.shared.health.skip() {
		o.settle(d, errResting)
		return d
	}
	o.cmu.Lock()
	if o.cstopped {
		o.cmu.Unlock()
		o.settle(d, errClaimLost) // stopped: no claimer runs it
		return d
	}
	o.claimq = append(o.claimq, claimReq{d: d, now: now, begin: time.Now()})
	o.cmu.Unlock()
	signal(o.cwake)
	return d
}

// Claim makes this gateway the device's owner ahead of its first
// decision (at its connection), so that the gateway it was on releases
// it and closes its session there. It returns once the claim ended.
func (o *Owner) Claim(device string) error {
	d := o.start1(device, o.clock.Now(), true)
	<-d.ready
	d.mu.Lock()
	ok := d.state == stReady
	d.mu.Unlock()
	if !ok {
		o.forget(d)
		return fmt.Errorf("claim %q: %w", device, errClaimLost)
	}
	return nil
}

// ClaimSoon queues the device's claim and returns at once: its first
// decision waits for it (the broker's connection hook).
func (o *Owner) ClaimSoon(device string) { o.start1(device, o.clock.Now(), true) }

// forget drops d from the map, if it is still d there.
func (o *Owner) forget(d *owned) {
	sh := o.shard(d.device)
	sh.mu.Lock()
	if sh.m[d.device] == d {
		delete(sh.m, d.device)
	}
	sh.mu.Unlock()
}

// settle ends d's claiming state: ready, or lost with err.
func (o *Owner) settle(d *owned, err error) {
	d.mu.Lock()
	if err != nil {
		d.state = stLost
	} else {
		d.state = stReady
	}
	d.mu.Unlock()
	d.settled.Store(true)
	close(d.ready)
}

// failClaims ends the claims of rs with err, logged once.
func (o *Owner) failClaims(rs []claimReq, err error) {
	if len(rs) == 0 {
		return
	}
	if !errors.Is(err, errResting) {
		o.log.Warn("devices not claimed; their decisions follow the failure policy until a claim succeeds",
			"devices", len(rs), "first", rs[0].d.device, "err", err.Error())
	}
	for _, r := range rs {
		o.settle(r.d, err)
	}
}

// claimer runs the queued claims, up to batchMax a script call: a
// connection storm is a queue, not a crowd of calls waiting for a
// connection of the pool.
func (o *Owner) claimer() {
	defer o.wg.Done()
	for {
		select {
		case <-o.stop:
			o.cmu.Lock()
			rs := o.claimq
			o.claimq, o.cstopped = nil, true
			o.cmu.Unlock()
			o.failClaims(rs, errClaimLost)
			return
		case <-o.cwake:
		}
		for {
			o.cmu.Lock()
			n := min(len(o.claimq), batchMax)
			rs := append([]claimReq(nil), o.claimq[:n]...)
			o.claimq = o.claimq[n:]
			if len(o.claimq) == 0 {
				o.claimq = nil
			}
			o.cmu.Unlock()
			if n == 0 {
				break
			}
			o.claimBatch(rs)
		}
	}
}

// claimBatch runs the claim script over rs. The devices no other
// gateway may still decide for are installed at once; those of a
// previous owner are settled off this loop (waitRelease).
func (o *Owner) claimBatch(rs []claimReq) {
	if o.shared.health.skip() {
		o.failClaims(rs, errResting)
		return
	}
	keys := make([]string, len(rs))
	for i, r := range rs {
		keys[i] = o.recordKey(r.d.device)
	}
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout(o.timeout, len(rs)))
	res, errs := o.many(ctx, o.rdb, claimScript, keys, []any{o.id}, nil)
	cancel()
	var failed, waiting []claimReq
	var ferr error
	for i, r := range rs {
		v, _ := res[i].([]any)
		switch {
		case errs[i] != nil:
			o.shared.health.failed(errs[i])
			failed, ferr = append(failed, r), errs[i]
			continue
		case len(v) != 6:
			failed, ferr = append(failed, r), errBadReply
			continue
		}
		o.shared.health.ok()
		r.epoch, _ = v[1].(int64)
		if w, _ := v[0].(int64); w == 1 {
			r.prev, _ = v[5].(string)
			waiting = append(waiting, r)
			continue
		}
		c, _ := v[2].(string)
		lm, _ := v[3].(int64)
		lb, _ := v[4].(int64)
		o.install(r, c, lm, lb)
	}
	o.failClaims(failed, ferr)
	if len(waiting) > 0 {
		go o.waitRelease(waiting)
	}
}

// install makes r's device this gateway's: its windows in the table
// from checkpoint c with the lease lm and lb it could not account for
// charged at the instant the claim settled.
func (o *Owner) install(r claimReq, c string, lm, lb int64) {
	d := r.d
	saved, err := decodeCheckpoint(c)
	if err != nil {
		o.log.Error("device's checkpoint in redis unreadable; its windows start empty", "device", d.device, "err", err.Error())
		saved = nil
	}
	at := r.now.Add(time.Since(r.begin))
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
			w = charged(sw.w, sw.has, units, sw.n, o.table.Buckets(), sw.length, r.now, at)
		}
		if w.Length > 0 && w.Total() > 0 {
			if err := o.table.Restore(sw.key(d.device), w); err != nil {
				o.log.Error("window of a checkpoint not restored", "device", d.device, "err", err.Error())
			}
		}
		wins = append(wins, sw.win)
	}
	d.mu.Lock()
	d.epoch, d.wins, d.durWins = r.epoch, wins, len(wins)
	d.sinceM, d.sinceB, d.leasedM, d.leasedB = recent{}, recent{}, 0, 0
	d.mu.Unlock()
	o.settle(d, nil)
}

// waitRelease settles claims on devices a previous owner may still
// decide for. A previous owner whose liveness key is gone has fenced
// itself: its devices settle at once. A live one is asked to release
// them (one request a gateway) and waited for until it has, or until
// its liveness TTL (kept in its key: a gateway configured with another
// TTL is waited for by its own) and a tenth have passed since the
// request: by then it has read the request at a renewal, or fenced
// itself. Then one settle script call for all: the checkpoint and the
// lease left to charge.
func (o *Owner) waitRelease(rs []claimReq) {
	byPrev := make(map[string][]claimReq)
	for _, r := range rs {
		byPrev[r.prev] = append(byPrev[r.prev], r)
	}
	ctx, cancel := context.WithTimeout(o.done, controlTimeout)
	defer cancel()
	pipe := o.ctl.Pipeline()
	ttls := make(map[string]*redis.StringCmd, len(byPrev))
	for prev := range byPrev {
		ttls[prev] = pipe.Get(ctx, o.prefix+"gw:"+prev)
	}
	_, _ = pipe.Exec(ctx)
	var gone, asked []claimReq
	var chans []chan struct{}
	wait := time.Duration(0)
	pipe = o.ctl.Pipeline()
	for prev, group := range byPrev {
		ttlMs, err := ttls[prev].Int64()
		switch {
		case errors.Is(err, redis.Nil):
			gone = append(gone, group...)
			continue
		case err != nil:
			o.failClaims(group, fmt.Errorf("read the liveness of gateway %s: %w", prev, err))
			continue
		}
		wait = max(wait, time.Duration(ttlMs)*time.Millisecond, o.ttl)
		devs := make([]any, len(group))
		for k, r := range group {
			devs[k] = r.d.device
			chans = append(chans, o.waiter(r.d.device))
		}
		pipe.SAdd(ctx, o.prefix+"rq:{"+prev+"}", devs...)
		pipe.Publish(ctx, o.prefix+"gwc:"+prev, "q")
		asked = append(asked, group...)
	}
	// Those whose previous owner is gone settle at once.
	o.settleClaims(ctx, gone)
	if len(asked) == 0 {
		return
	}
	defer o.unwait(asked)
	o.stats.waits.Add(uint64(len(asked)))
	if _, err := pipe.Exec(ctx); err != nil {
		// Not asked: the claims fail, and the next decisions claim again
		// (the records name the owners to ask).
		o.failClaims(asked, fmt.Errorf("ask gateways to release: %w", err))
		return
	}
	// The requests are in Redis once the pipeline answered: within the
	// TTL each owner reads them at a liveness renewal, or fences itself.
	timer := time.NewTimer(wait + wait/10)
	defer timer.Stop()
wait:
	for _, ch := range chans {
		select {
		case <-ch:
		case <-timer.C:
			break wait
		case <-o.stop:
			o.failClaims(asked, errClaimLost)
			return
		}
	}
	ctx2, cancel2 := context.WithTimeout(o.done, controlTimeout)
	defer cancel2()
	o.settleClaims(ctx2, asked)
}

// settleClaims runs the settle script over rs, in batches, and installs
// the devices that are this gateway's.
func (o *Owner) settleClaims(ctx context.Context, rs []claimReq) {
	var lost, failed []claimReq
	var ferr error
	chunks(len(rs), func(lo, hi int) {
		part := rs[lo:hi]
		keys := make([]string, len(part))
		args := make([]any, len(part))
		for i, r := range part {
			keys[i], args[i] = o.recordKey(r.d.device), r.epoch
		}
		res, errs := o.many(ctx, o.ctl, settleScript, keys, []any{o.id}, args)
		for i, r := range part {
			v, _ := res[i].([]any)
			switch {
			case errs[i] != nil:
				failed, ferr = append(failed, r), fmt.Errorf("settle: %w", errs[i])
			case len(v) != 4 || v[0] != int64(1):
				lost = append(lost, r)
			default:
				c, _ := v[1].(string)
				lm, _ := v[2].(int64)
				lb, _ := v[3].(int64)
				o.install(r, c, lm, lb)
			}
		}
	})
	o.failClaims(lost, errClaimLost)
	o.failClaims(failed, ferr)
}

// waiter registers a claim waiting for device's release; the listener
// signals it.
func (o *Owner) waiter(device string) chan struct{} {
	ch := make(chan struct{}, 1)
	o.wmu.Lock()
	o.waiters[device] = ch
	o.wmu.Unlock()
	return ch
}

// unwait drops the waiters of rs.
func (o *Owner) unwait(rs []claimReq) {
	o.wmu.Lock()
	for _, r := range rs {
		delete(o.waiters, r.d.device)
	}
	o.wmu.Unlock()
}
