package cluster

import (
	"context"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// enqueue queues d for the next checkpoint (d.mu held); urgent wakes
// the writer at once (a decision waits for it).
func (o *Owner) enqueue(d *owned, urgent bool) {
	if !d.queued {
		d.queued = true
		o.pmu.Lock()
		o.pending = append(o.pending, d)
		o.pmu.Unlock()
	}
	if urgent {
		select {
		case o.wake <- struct{}{}:
		default:
		}
	}
}

// flusher writes the queued checkpoints: at once when a decision waits,
// else every flush interval.
func (o *Owner) flusher() {
	defer o.wg.Done()
	tick := time.NewTicker(o.flush)
	defer tick.Stop()
	var batch []*owned
	for {
		select {
		case <-o.stop:
			return
		case <-o.wake:
		case <-tick.C:
		}
		o.pmu.Lock()
		batch, o.pending = o.pending, batch[:0]
		o.pmu.Unlock()
		if len(batch) > 0 {
			o.checkpoint(batch)
		}
	}
}

// snap is one device's checkpoint on its way to Redis.
type snap struct {
	d            *owned
	epoch        int64
	usedM, usedB int64
	leaseM       int64
	leaseB       int64
	wins         int
	args         []any
}

// checkpoint writes the checkpoints of batch, one script call (one per
// device, pipelined, on Redis Cluster), and raises each device's
// durable caps, or drops the devices whose record another gateway owns.
func (o *Owner) checkpoint(batch []*owned) {
	snaps := make([]snap, 0, len(batch))
	keys := make([]string, 0, len(batch))
	for _, d := range batch {
		d.mu.Lock()
		d.queued = false
		if d.state == stReady {
			s := snap{d: d, epoch: d.epoch, usedM: d.usedM, usedB: d.usedB, leaseM: o.leaseM(d), leaseB: o.leaseB(d), wins: len(d.wins)}
			c := appendCheckpoint(nil, o.table, d.device, d.wins)
			s.args = []any{o.id, d.epoch, c, s.leaseM, s.leaseB}
			snaps = append(snaps, s)
			keys = append(keys, o.recordKey(d.device))
		}
		d.mu.Unlock()
	}
	if len(snaps) == 0 {
		return
	}
	o.stats.checkpoints.Add(uint64(len(snaps)))
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout+time.Duration(len(snaps))*time.Microsecond*20)
	defer cancel()
	res := make([]int64, len(snaps))
	errs := make([]error, len(snaps))
	if o.multi {
		args := make([]any, 0, 5*len(snaps))
		for _, s := range snaps {
			args = append(args, s.args...)
		}
		v, err := checkpointScript.Run(ctx, o.rdb, keys, args...).Int64Slice()
		if err == nil && len(v) != len(snaps) {
			err = errBadReply
		}
		for i := range snaps {
			if errs[i] = err; err == nil {
				res[i] = v[i]
			}
		}
	} else {
		pipe := o.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(snaps))
		for i, s := range snaps {
			cmds[i] = checkpointScript.EvalSha(ctx, pipe, keys[i:i+1], s.args...)
		}
		_, _ = pipe.Exec(ctx)
		for i, cmd := range cmds {
			if err := cmd.Err(); err != nil && isNoScript(err) {
				cmd = checkpointScript.Run(ctx, o.rdb, keys[i:i+1], snaps[i].args...)
			}
			var v []int64
			if v, errs[i] = cmd.Int64Slice(); errs[i] == nil {
				if len(v) == 1 {
					res[i] = v[0]
				} else {
					errs[i] = errBadReply
				}
			}
		}
	}
	for i, s := range snaps {
		d := s.d
		d.mu.Lock()
		switch {
		case errs[i] != nil:
			o.shared.health.failed(errs[i])
		case res[i] == 1:
			o.shared.health.ok()
			if d.epoch == s.epoch && d.state == stReady {
				d.capM, d.capB = s.usedM+s.leaseM, s.usedB+s.leaseB
				d.durWins = max(d.durWins, s.wins)
			}
		default:
			o.stats.fenced.Add(1)
			if d.epoch == s.epoch && d.state == stReady {
				d.state = stLost
				o.lost(d)
			}
		}
		close(d.landed)
		d.landed = make(chan struct{})
		d.mu.Unlock()
	}
}

// lost drops d, whose device another gateway took (d.mu held), and
// closes its sessions here.
func (o *Owner) lost(d *owned) {
	go func() {
		o.forget(d)
		if o.onLost != nil {
			o.onLost(d.device)
		}
	}()
}

// heartbeat renews this gateway's liveness every quarter TTL (at once
// when nudged), reads the release requests with it, and moves the
// fence: leases may be used until the TTL after the send of the last
// renewal Redis acknowledged.
func (o *Owner) heartbeat() {
	defer o.wg.Done()
	tick := time.NewTicker(o.ttl / 4)
	defer tick.Stop()
	for {
		sent := o.mono()
		ctx, cancel := context.WithTimeout(context.Background(), o.ttl/4)
		pipe := o.ctl.Pipeline()
		pipe.Set(ctx, o.prefix+"gw:"+o.id, o.ttl.Milliseconds(), o.ttl)
		rq := pipe.SMembers(ctx, o.prefix+"rq:{"+o.id+"}")
		_, err := pipe.Exec(ctx)
		cancel()
		if err == nil {
			o.fence.Store(sent + int64(o.ttl))
			if devs := rq.Val(); len(devs) > 0 {
				select {
				case o.rel <- devs:
				default: // the releaser is busy; the next renewal reads them again
				}
			}
		} else {
			o.log.Warn("liveness not renewed in redis", "err", err.Error())
		}
		select {
		case <-o.stop:
			return
		case <-tick.C:
		case <-o.beat:
		}
	}
}

// releaser releases the devices the liveness loop found requested,
// off that loop, so that renewals stay regular however many there are.
func (o *Owner) releaser() {
	defer o.wg.Done()
	for {
		select {
		case <-o.stop:
			return
		case devs := <-o.rel:
			for _, device := range devs {
				o.release(device)
			}
		}
	}
}

// release gives device up at another gateway's request: no decision
// here after this, its final windows written with no lease, its
// sessions closed.
func (o *Owner) release(device string) {
	ctx, cancel := context.WithTimeout(context.Background(), controlTimeout)
	defer cancel()
	o.releaseCtx(ctx, device, true)
}

// releaseCtx is release within ctx; notify: close the device's
// sessions.
func (o *Owner) releaseCtx(ctx context.Context, device string, notify bool) {
	sh := o.shard(device)
	sh.mu.RLock()
	d := sh.m[device]
	sh.mu.RUnlock()
	if d != nil {
		if !d.settled.Load() {
			return // this gateway's own claim of it is under way: asked again at the next renewal
		}
		d.mu.Lock()
		was := d.state == stReady
		d.state = stLost
		epoch := d.epoch
		c := appendCheckpoint(nil, o.table, device, d.wins)
		d.mu.Unlock()
		if was {
			o.stats.releases.Add(1)
			if err := releaseScript.Run(ctx, o.ctl, []string{o.recordKey(device)}, o.id, epoch, c, o.prefix).Err(); err != nil {
				o.log.Warn("device's final windows not written; the new owner charges its lease", "device", device, "err", err.Error())
			}
			// Closed before the device is forgotten: a publish racing the
			// close takes the failure policy rather than claiming it back.
			if notify && o.onLost != nil {
				o.onLost(device)
			}
		}
		o.forget(d)
	}
	o.ctl.SRem(ctx, o.prefix+"rq:{"+o.id+"}", device)
}

// listen takes this gateway's channel: "q<device>" nudges the liveness
// loop to read the release requests, "r<device>" tells a waiting claim
// that the device was released.
func (o *Owner) listen() {
	defer o.wg.Done()
	ch := o.pubsub.Channel()
	for {
		select {
		case <-o.stop:
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			switch {
			case strings.HasPrefix(m.Payload, "q"):
				select {
				case o.beat <- struct{}{}:
				default:
				}
			case strings.HasPrefix(m.Payload, "r"):
				o.wmu.Lock()
				w := o.waiters[m.Payload[1:]]
				o.wmu.Unlock()
				if w != nil {
					select {
					case w <- struct{}{}:
					default:
					}
				}
			}
		}
	}
}

// Close stops the owner: it releases every device it owns (their next
// owner charges nothing; those not released within controlTimeout in
// all, Redis being slow or away, are charged their lease as after a
// crash) and deletes its liveness key.
func (o *Owner) Close() {
	o.once.Do(func() {
		close(o.stop)
		o.wg.Wait()
		// No lease counts from here: its devices are released below, and
		// the liveness key deleted after, on which a claim settles at
		// once; a decision still coming takes the failure policy.
		o.fence.Store(0)
		_ = o.pubsub.Close()
		var devices []string
		for i := range o.shards {
			sh := &o.shards[i]
			sh.mu.RLock()
			for dev := range sh.m {
				devices = append(devices, dev)
			}
			sh.mu.RUnlock()
		}
		ctx, cancel := context.WithTimeout(context.Background(), controlTimeout)
		defer cancel()
		for _, dev := range devices {
			if ctx.Err() != nil {
				break
			}
			o.releaseCtx(ctx, dev, false)
		}
		o.ctl.Del(ctx, o.prefix+"gw:"+o.id, o.prefix+"rq:{"+o.id+"}")
	})
}

// kill stops the owner as a crash would: nothing released, nothing
// written; its liveness key expires by itself (tests delete it).
func (o *Owner) kill() {
	o.once.Do(func() {
		o.fence.Store(0)
		close(o.stop)
		o.wg.Wait()
		_ = o.pubsub.Close()
	})
}
