package cluster

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// closeTimeout bounds Close's release of every device, Redis being slow
// or away: within a gateway's shutdown (server.ShutdownTimeout, 5 s).
const closeTimeout = 2 * time.Second

// heartbeat renews this gateway's liveness every quarter TTL (at once
// when nudged), reads the release requests with it, and moves the
// fence: leases may be used until the TTL after the send of the last
// renewal Redis acknowledged. Before the fence moves, the requested
// devices stop being decided here (their release is written after, off
// this loop), and after a lapse (the fence passed before the renewal
// was acknowledged: the gateway may have been taken for dead and its
// devices claimed without a request), or after its key vanished before
// its TTL (Redis lost its data), every lease is void until a checkpoint
// Redis accepts. Stopping does not wait for a renewal under way
// (renew).
func (o *Owner) heartbeat() {
	defer o.wg.Done()
	tick := time.NewTicker(o.ttl / 4)
	defer tick.Stop()
	for {
		sent := o.mono()
		var set *redis.StatusCmd
		var rq *redis.StringSliceCmd
		var err error
		select {
		case <-o.stop:
			return
		case r := <-o.renew():
			set, rq, err = r.set, r.rq, r.err
		}
		if errors.Is(err, redis.Nil) {
			err = rq.Err() // the key was not there: SET's GET answers nil
		}
		if err == nil {
			// A key gone before its TTL (Redis restarted empty, or a
			// failover lost it) is a lapse too: the devices' records went
			// with it, and another gateway may have claimed them as new.
			gone := errors.Is(set.Err(), redis.Nil) && o.fence.Load() != 0
			if o.mono() >= o.fence.Load() || gone {
				o.lapsed()
			}
			if devs := rq.Val(); len(devs) > 0 {
				o.giveUp(devs)
			}
			o.fence.Store(sent + int64(o.ttl))
		} else if o.done.Err() == nil { // not cut short by Close
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

// renewal is the answer to one liveness renewal.
type renewal struct {
	set *redis.StatusCmd
	rq  *redis.StringSliceCmd
	err error
}

// renew sends a liveness renewal, reading the release requests with it,
// on a goroutine of its own: a Redis that does not answer (SIGSTOP, a
// network cut) holds a read until its deadline, which cancelling the
// context does not end, and Close must not wait for it (a gateway's
// shutdown leaves its time to the releases and the final snapshot). An
// answer after the heartbeat stopped goes unread: the goroutine only
// ends, bounded by the renewal's timeout.
func (o *Owner) renew() <-chan renewal {
	ch := make(chan renewal, 1)
	go func() {
		ctx, cancel := context.WithTimeout(o.done, o.ttl/4)
		defer cancel()
		pipe := o.ctl.Pipeline()
		r := renewal{
			set: pipe.SetArgs(ctx, o.prefix+"gw:"+o.id, o.ttl.Milliseconds(), redis.SetArgs{TTL: o.ttl, Get: true}),
			rq:  pipe.SMembers(ctx, o.prefix+"rq:{"+o.id+"}"),
		}
		_, r.err = pipe.Exec(ctx)
		ch <- r
	}()
	return ch
}

// lapsed voids every lease after a lapse of the liveness: a device is
// decided here again only once a checkpoint Redis accepted (under its
// epoch: it is still this gateway's) gives it a lease.
func (o *Owner) lapsed() {
	o.gen.Add(1)
	n := 0
	for i := range o.shards {
		sh := &o.shards[i]
		sh.mu.RLock()
		for _, d := range sh.m {
			d.mu.Lock()
			d.leasedM, d.leasedB = 0, 0
			d.mu.Unlock()
			n++
		}
		sh.mu.RUnlock()
	}
	if n > 0 {
		o.log.Warn("liveness renewed after a lapse; every device passes a checkpoint before its next admission", "devices", n)
	}
}

// parting is a device on its way out: its final checkpoint, written
// with no lease.
type parting struct {
	device string
	d      *owned // nil: not owned here
	epoch  int64
	c      []byte
	was    bool // it was decided here (ready)
}

// part stops deciding for device here and returns its final state; ok
// false while this gateway's own claim of it is under way (asked again
// at the next renewal).
func (o *Owner) part(device string) (parting, bool) {
	p := parting{device: device}
	sh := o.shard(device)
	sh.mu.RLock()
	p.d = sh.m[device]
	sh.mu.RUnlock()
	if p.d == nil {
		return p, true
	}
	if !p.d.settled.Load() {
		return p, false
	}
	p.d.mu.Lock()
	p.was = p.d.state == stReady
	switch {
	case p.was:
		p.d.part()
	case p.d.state != stParted:
		p.d.state = stLost
	}
	p.epoch = p.d.epoch
	if p.was {
		p.c = appendCheckpoint(nil, o.table, device, p.d.wins)
	}
	p.d.mu.Unlock()
	return p, true
}

// giveUp stops deciding for the requested devices at once and queues
// their release for the releaser; none is dropped.
func (o *Owner) giveUp(devs []string) {
	var ps []parting
	for _, dev := range devs {
		if p, ok := o.part(dev); ok {
			ps = append(ps, p)
		}
	}
	if len(ps) == 0 {
		return
	}
	o.relMu.Lock()
	o.relq = append(o.relq, ps...)
	o.relMu.Unlock()
	signal(o.rel) // a wake-up pending takes the whole queue too
}

// releaser writes the releases the liveness loop queued, in batches,
// off that loop, so that renewals stay regular however many there are.
func (o *Owner) releaser() {
	defer o.wg.Done()
	for {
		select {
		case <-o.stop:
			return
		case <-o.rel:
		}
		o.relMu.Lock()
		ps := o.relq
		o.relq = nil
		o.relMu.Unlock()
		ctx, cancel := context.WithTimeout(o.done, controlTimeout)
		// Every batch, even once ctx ended (its script call then fails
		// at once): the devices' sessions here are closed and the
		// devices forgotten all the same, or their publishes here would
		// stay refused (Owner.parted).
		chunks(len(ps), func(lo, hi int) { o.releaseBatch(ctx, ps[lo:hi], true) })
		devs := make([]any, len(ps))
		for i, p := range ps {
			devs[i] = p.device
		}
		if len(devs) > 0 {
			o.ctl.SRem(ctx, o.prefix+"rq:{"+o.id+"}", devs...)
		}
		cancel()
	}
}

// releaseBatch writes the final windows of ps (those decided here) in
// one script call, with no lease, and forgets them; notify: close their
// sessions first. It reports whether Redis answered.
func (o *Owner) releaseBatch(ctx context.Context, ps []parting, notify bool) bool {
	var keys []string
	var args []any
	for _, p := range ps {
		if p.was {
			keys = append(keys, o.recordKey(p.device))
			args = append(args, p.epoch, p.c)
		}
	}
	o.stats.releases.Add(uint64(len(keys)))
	_, errs := o.many(ctx, o.ctl, releaseScript, keys, []any{o.prefix, o.id}, args)
	failed := 0
	for _, err := range errs {
		if err != nil {
			if failed == 0 {
				o.log.Warn("devices' final windows not written; their next owner charges their lease", "devices", len(keys), "err", err.Error())
			}
			failed++
		}
	}
	for _, p := range ps {
		if p.d == nil {
			continue
		}
		// Closed before the device is forgotten: a publish racing the
		// close is refused (Owner.parted) rather than claiming it back.
		if p.was && notify && o.onLost != nil {
			o.onLost(p.device)
		}
		p.d.goneHere()
		if notify && p.d.parted.Load() {
			o.forgetParted(p.d)
		} else {
			o.forget(p.d)
		}
	}
	return failed == 0
}

// Close stops the owner: it releases every device it owns, in batches
// within closeTimeout in all (their next owner charges nothing; with
// Redis slow or away, the first batch that fails ends it, and the rest
// are charged their lease as after a crash), and, when the releases
// were written, deletes its liveness key. The loops' calls to Redis
// under way are cut short, not waited out.
func (o *Owner) Close() {
	o.once.Do(func() {
		close(o.stop)
		o.cancel()
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
		ps := make([]parting, 0, len(devices))
		for _, dev := range devices {
			if p, ok := o.part(dev); ok {
				ps = append(ps, p)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		ok := true
		chunks(len(ps), func(lo, hi int) {
			if ok && ctx.Err() == nil {
				ok = o.releaseBatch(ctx, ps[lo:hi], false)
			}
		})
		if ok && ctx.Err() == nil {
			o.returnGrants(ctx)
			o.ctl.Del(ctx, o.prefix+"gw:"+o.id, o.prefix+"rq:{"+o.id+"}")
		}
	})
}

// kill stops the owner as a crash would: nothing released, nothing
// written; its liveness key expires by itself (tests delete it).
func (o *Owner) kill() {
	o.once.Do(func() {
		o.fence.Store(0)
		close(o.stop)
		o.cancel()
		o.wg.Wait()
		_ = o.pubsub.Close()
	})
}
