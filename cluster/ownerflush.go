package cluster

import (
	"context"
	"strings"
	"time"
)

// enqueue queues d for the next checkpoint (d.mu held); urgent wakes
// the writer at once (a decision waits for it), else the first device
// queued starts the flush interval.
func (o *Owner) enqueue(d *owned, urgent bool) {
	if !d.queued {
		d.queued = true
		o.pmu.Lock()
		first := len(o.pending) == 0
		o.pending = append(o.pending, d)
		o.pmu.Unlock()
		if first {
			signal(o.soon)
		}
	}
	if urgent {
		signal(o.wake)
	}
}

// signal wakes the loop reading ch (capacity 1) unless it is woken
// already.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// flusher writes the queued checkpoints: at once when a decision waits,
// else a flush interval after the first was queued; while Redis rests
// after a failure (health.skip) they stay queued and are tried again
// every interval, and decisions that need one take the failure policy
// at once. With nothing queued it sleeps: a gateway whose devices stay
// within their leases (most of a fleet at steady state) is not woken ten
// times a second for nothing.
func (o *Owner) flusher() {
	defer o.wg.Done()
	timer := time.NewTimer(o.flush)
	defer timer.Stop()
	armed := true
	arm := func() {
		if !armed {
			timer.Reset(o.flush)
			armed = true
		}
	}
	var batch []*owned
	for {
		select {
		case <-o.stop:
			return
		case <-o.soon:
			arm()
			continue
		case <-o.wake:
		case <-timer.C:
			armed = false
		}
		if o.shared.health.skip() {
			arm()
			continue
		}
		o.pmu.Lock()
		batch, o.pending = o.pending, batch[:0]
		o.pmu.Unlock()
		chunks(len(batch), func(lo, hi int) { o.checkpoint(batch[lo:hi]) })
	}
}

// snap is one device's checkpoint on its way to Redis.
type snap struct {
	d              *owned
	epoch, gen     int64
	sinceM, sinceB recent
	leaseM, leaseB int64
	wins           int
	resets         int64 // d.resets when it was taken
}

// checkpoint writes the checkpoints of batch in one script call (one per
// device, pipelined, on Redis Cluster) and makes each device's lease the
// one written, or drops the devices whose record another gateway owns.
func (o *Owner) checkpoint(batch []*owned) {
	snaps := make([]snap, 0, len(batch))
	keys := make([]string, 0, len(batch))
	args := make([]any, 0, 4*len(batch))
	gen := o.gen.Load()
	for _, d := range batch {
		d.mu.Lock()
		d.queued = false
		if d.state == stReady {
			s := snap{d: d, epoch: d.epoch, gen: gen, sinceM: d.sinceM, sinceB: d.sinceB, wins: len(d.wins), resets: d.resets}
			if d.durReset == d.resets { // else a reset's checkpoint: no lease (Owner.Reset)
				s.leaseM, s.leaseB = o.leaseM(d), o.leaseB(d)
			}
			args = append(args, d.epoch, appendCheckpoint(nil, o.table, d.device, d.wins), s.leaseM, s.leaseB)
			snaps = append(snaps, s)
			keys = append(keys, o.recordKey(d.device))
		}
		d.mu.Unlock()
	}
	if len(snaps) == 0 {
		return
	}
	o.stats.checkpoints.Add(uint64(len(snaps)))
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout(o.timeout, len(snaps)))
	defer cancel()
	res, errs := o.many(ctx, o.rdb, checkpointScript, keys, []any{o.id}, args)
	for i, s := range snaps {
		d := s.d
		d.mu.Lock()
		written, _ := res[i].(int64)
		switch {
		case errs[i] != nil:
			o.shared.health.failed(errs[i])
			d.ckErr = errs[i]
		case written == 1:
			o.shared.health.ok()
			d.ckErr = nil
			if d.epoch == s.epoch {
				d.durReset = max(d.durReset, s.resets) // the record holds it, whatever came since
			}
			// A lapse of the liveness since the snapshot (gen moved): the
			// device may have been claimed elsewhere meanwhile; the next
			// checkpoint tells.
			if d.epoch == s.epoch && d.state == stReady && o.gen.Load() == s.gen {
				d.sinceM.drop(&s.sinceM)
				d.sinceB.drop(&s.sinceB)
				if s.resets == d.resets { // a lease taken before a reset is void
					d.leasedM, d.leasedB = s.leaseM, s.leaseB
				}
				d.durWins = max(d.durWins, s.wins)
			}
		default:
			o.stats.fenced.Add(1)
			if d.epoch == s.epoch && d.state == stReady {
				d.part()
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
		// Closed before the device is forgotten, as in releaseBatch: a
		// publish racing the close is refused (Owner.parted), neither
		// decided by the failure policy nor claiming the device back.
		if o.onLost != nil {
			o.onLost(d.device)
		}
		d.goneHere()
		o.forgetParted(d)
	}()
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
				signal(o.beat)
			case strings.HasPrefix(m.Payload, "r"):
				o.wmu.Lock()
				w := o.waiters[m.Payload[1:]]
				o.wmu.Unlock()
				if w != nil {
					signal(w)
				}
			}
		}
	}
}
