package broker

import (
	"container/heap"
	"errors"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// The release side of deferral: the heap of due devices, the release
// rounds, and the batched deletes of what was released or expired.

// schedule puts dq in the heap, due at due. With wake set it wakes the
// release loop when dq became the earliest; a release round does not
// need it, the loop reads the earliest after each round. Called with
// dq's shard lock held.
func (d *deferrer) schedule(dq *devQueue, due devicelimit.Tick, wake bool) {
	dq.scheduled = true
	d.heapMu.Lock()
	dq.due = due
	heap.Push(&d.due, dq)
	first := d.due[0] == dq
	d.heapMu.Unlock()
	if wake && first {
		select {
		case d.wake <- struct{}{}:
		default:
		}
	}
}

// failed logs a store or release failure at Error, at most once per
// storeErrorLogWindow for each kind (msg), with the number of failures
// of all kinds since the last line.
func (d *deferrer) failed(msg string, err error, device string) {
	n := d.failures.Add(1)
	if d.logs.allow(logDefer, msg, storeErrorLogWindow) {
		d.failures.Add(-n)
		d.log.Error(msg, "error", err, "device", device, "failures", n)
	}
}

// releaseTick runs one release round at now: every device due by now
// is taken from the heap; its expired head messages are dropped, and
// messages are published while its window admits them; a device with
// messages left goes back in the heap, due when its window next admits
// one. It returns the earliest due instant left, if any. A round looks
// only at the devices due: its cost does not grow with the devices
// waiting.
func (d *deferrer) releaseTick(now devicelimit.Tick) (next devicelimit.Tick, ok bool) {
	d.roundMu.Lock()
	defer d.roundMu.Unlock()
	d.rounds.Add(1)
	released := false
	for {
		d.heapMu.Lock()
		if len(d.due) == 0 || d.due[0].due > now {
			if len(d.due) > 0 {
				next, ok = d.due[0].due, true
			}
			d.heapMu.Unlock()
			break
		}
		dq := heap.Pop(&d.due).(*devQueue)
		d.heapMu.Unlock()
		d.visited.Add(1)
		if d.releaseDevice(dq, now) {
			released = true
		}
	}
	if released {
		select {
		case d.delKick <- struct{}{}:
		default:
		}
	}
	return next, ok
}

// releaseDevice releases what dq's window admits at now and reports
// whether it removed any message. dq was just taken from the heap.
func (d *deferrer) releaseDevice(dq *devQueue, now devicelimit.Tick) bool {
	sh := d.shard(dq.device)
	// Decide outside the lock: with windows in Redis a decision is a
	// round trip, which must not stall the shard's other devices. The
	// prefix read here stays put: publishes only append, and only release
	// rounds, one at a time, remove from the head.
	sh.mu.Lock()
	msgs := dq.msgs
	sh.mu.Unlock()
	batch := d.batch[:0]
	var retry time.Duration
	// A connected device's messages are released as its publishes of
	// them would be decided now (decideRelease): the topic class, the
	// quota, the rule's runtime enforce switch and the group its
	// connection is under now, not those they were queued under. After
	// a reload changed or removed its rule or class, both would
	// otherwise count in one window at two lengths, each re-cut to the
	// shorter forgetting what the longer must still count
	// (TestReloadRemovesRuleClassGroup: 10 admitted in an hour under a
	// quota of 6), or in a removed class's window its new messages no
	// longer count in. A device not connected has no such decision:
	// its messages go by the quota they were queued under (or its
	// override), in the window of the class they were queued in.
	c := d.live(dq.device)
	for _, m := range msgs {
		if d.expiredAt(&m, now) {
			batch = append(batch, batchItem{queuedMsg: m, expired: true})
			continue
		}
		var dec devicelimit.Decision
		var stored deferredMsg
		err := errNotConnected
		if c != nil {
			// Its topic, as a publish's finds its topic class, from its
			// record: the queue keeps no copy apart (queuedMsgSize).
			stored, err = decodeStored(m.rec)
		}
		if err == nil {
			dec = d.decideAs(c, stored.Topic, m.size, now)
		} else {
			// Not connected, or a record that no longer decodes (its
			// release fails, logged, and drops it).
			q := d.resolver.QuotaAt(dq.device, m.quota, now)
			if dq.class != "" {
				q = d.resolver.ClassQuotaAt(dq.device, dq.class, m.quota, now)
			}
			dec = d.table.AllowClassAt(dq.device, dq.class, q, m.size, now)
		}
		if dec.TooLarge {
			// The quota changed since it was queued and no window can
			// take it now: dropped as expired, not held for ever.
			batch = append(batch, batchItem{queuedMsg: m, expired: true})
			continue
		}
		if !dec.Allowed {
			retry = max(dec.RetryAfter, minReleaseSleep)
			break
		}
		if !leased(d.leases, dec.Lease) {
			// Counted, but not to be published before its lease is
			// durable: it stays queued, and is counted again later.
			retry = minReleaseSleep
			break
		}
		batch = append(batch, batchItem{queuedMsg: m})
	}

	// Publish outside the lock: a publish of the device meanwhile finds
	// these messages still queued and queues behind them.
	var gone int64
	for i := range batch {
		it := &batch[i]
		gone += int64(len(it.rec))
		if it.expired {
			d.expired.Add(1)
		} else {
			d.release(dq.device, &it.queuedMsg, now)
		}
	}

	sh.mu.Lock()
	// Only release rounds remove messages, from the head: batch is still
	// the queue's prefix.
	clear(dq.msgs[:len(batch)]) // let the records go
	dq.msgs = dq.msgs[len(batch):]
	if len(dq.msgs) == 0 {
		dq.msgs = nil
	}
	dq.bytes -= gone
	d.queueMsgs.Add(-int64(len(batch)))
	d.queueBytes.Add(-gone)
	d.budget.Add(-(gone + int64(len(batch))*queuedMsgSize))
	if len(dq.msgs) > 0 {
		// retry is 0 when the whole queue went out and more came in
		// meanwhile: those are due now.
		d.schedule(dq, now.Add(retry), false)
	} else {
		dq.scheduled = false
		d.forgetIfIdle(sh, dq)
	}
	sh.mu.Unlock()

	if len(batch) > 0 {
		d.delMu.Lock()
		for i := range batch {
			d.dels = append(d.dels, DeferredKey{Device: dq.key, Seq: batch[i].seq})
		}
		d.delMu.Unlock()
	}
	n := len(batch)
	clear(batch)
	d.batch = batch[:0]
	return n > 0
}

// decideRelease decides the release of a deferred message on topic of
// size bytes of c's device at now as OnPublish would decide a publish
// of it on c now: its topic class and quota (ClassAt: override, rule,
// the rule's runtime enforce switch), its group's windows, shadow mode
// letting it through (counted as would-refuse, not logged: the log
// limiter's cache is c's OnPublish's alone).
func (h *throttle) decideRelease(c *connInfo, topic string, size int, now devicelimit.Tick) devicelimit.Decision {
	v := c.rules()
	class, q := h.resolver.ClassAt(c.device, v.rule, v.ruleName, v.classes, topic, now)
	var gq devicelimit.Quota
	d, _, _ := h.judge(c, class, &q, &gq, size, now)
	return d
}

// errNotConnected: a queued message's device has no connection.
var errNotConnected = errors.New("not connected")

// batchItem is a message a release round took from the head of a queue.
type batchItem struct {
	queuedMsg
	expired bool
}

// release publishes m as its device at now. A message that cannot be
// published (its record no longer decodes) is logged and dropped.
func (d *deferrer) release(device string, m *queuedMsg, now devicelimit.Tick) {
	msg, err := decodeStored(m.rec)
	if err == nil {
		msg.Released = now
		err = d.publish(device, &msg, remainingExpiry(m, now))
	}
	if err != nil {
		d.failed("deferred message not released", err, device)
		return
	}
	d.released.Add(1)
}

// expiredAt reports whether m must be dropped at now: it waited MaxAge,
// or its MQTT 5 message expiry interval has passed.
func (d *deferrer) expiredAt(m *queuedMsg, now devicelimit.Tick) bool {
	age := now.Sub(m.enqueued)
	return age >= d.limits.MaxAge || (m.expiry > 0 && age >= time.Duration(m.expiry)*time.Second)
}

// remainingExpiry is m's message expiry interval at now, less the time it
// waited, in whole seconds and at least 1 (as mochi rounds it); 0 when m
// has none.
func remainingExpiry(m *queuedMsg, now devicelimit.Tick) uint32 {
	if m.expiry == 0 {
		return 0
	}
	left := time.Duration(m.expiry)*time.Second - now.Sub(m.enqueued)
	return uint32(max(left/time.Second, 1))
}

// run is the release loop: it sleeps until the heap's earliest due
// instant, or until a device becomes the earliest, and runs a round. It
// returns when stop is closed.
func (d *deferrer) run(stop <-chan struct{}) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		if next, ok := d.releaseTick(d.clock.Now()); ok {
			t.Reset(max(next.Sub(d.clock.Now()), minReleaseSleep))
		}
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		case <-d.wake:
			t.Stop()
		}
		d.wakes.Add(1)
	}
}

// runDeletes deletes released and expired messages from the store, at
// most once per deleteInterval, until stop is closed; then it deletes
// what is left.
func (d *deferrer) runDeletes(stop <-chan struct{}) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		select {
		case <-stop:
			d.flushDeletes()
			return
		case <-d.delKick:
		}
		d.flushDeletes()
		t.Reset(deleteInterval)
		select {
		case <-stop:
			t.Stop()
			d.flushDeletes()
			return
		case <-t.C:
		}
	}
}

// flushDeletes deletes the keys released so far in one store call. Keys
// that fail are kept for the next call: until deleted, they would be
// released again after a restart.
func (d *deferrer) flushDeletes() {
	d.flushMu.Lock()
	defer d.flushMu.Unlock()
	d.delMu.Lock()
	keys := d.dels
	d.dels = nil
	d.delMu.Unlock()
	if len(keys) == 0 {
		return
	}
	if err := d.store.DeleteDeferred(keys); err != nil {
		d.delMu.Lock()
		d.dels = append(keys, d.dels...)
		d.delMu.Unlock()
		d.failed("released messages not deleted", err, keys[0].Device)
	}
}

// dueHeap orders device queues by due instant (container/heap).
type dueHeap []*devQueue

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(*devQueue)) }
func (h *dueHeap) Pop() any {
	old := *h
	q := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return q
}
