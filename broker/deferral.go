package broker

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
)

// DeferStore keeps deferred messages durably. cmd/gateway passes a
// persist.Store through a small adapter (persist names its key type
// persist.DeferredKey, and broker does not import persist).
type DeferStore interface {
	// Enqueue stores rec under (device, seq). It returns only once the
	// record is durable: the publisher's ack waits for it.
	Enqueue(device string, seq uint64, rec []byte) error
	// DeleteDeferred removes released and expired messages. Missing keys are
	// not an error.
	DeleteDeferred(keys []DeferredKey) error
	// LoadDeferred calls fn for every stored message, grouped by device
	// and in increasing seq within a device; rec is valid only during
	// the call.
	LoadDeferred(fn func(device string, seq uint64, rec []byte) error) error
	// SetAsideDeferred moves damaged messages out of the queue, durably,
	// kept in the store but never loaded again; held is how many
	// damaged messages the store holds after the move.
	SetAsideDeferred(keys []DeferredKey) (held int, err error)
}

// DeferredKey names one stored deferred message. It aliases an unnamed
// struct type, identical to persist.DeferredKey, so a *persist.Store is
// a DeferStore as it is.
type DeferredKey = struct {
	Device string
	Seq    uint64
}

// Defaults of DeferLimits' zero fields.
const (
	DefaultDeferMaxMessagesPerDevice = 1000
	DefaultDeferMaxBytesPerDevice    = 1 << 20
	DefaultDeferMaxTotalBytes        = 256 << 20
	DefaultDeferMaxAge               = time.Hour
)

// DeferLimits bound the deferral queue. A message that would exceed a
// limit is refused like a message over quota under policy drop; one
// older than MaxAge when its turn comes is dropped, never released.
// Sizes are those of the stored records (topic, payload, properties and
// about 20 bytes). Zero fields take the defaults.
type DeferLimits struct {
	// MaxMessagesPerDevice is the most messages one device may have
	// queued (default 1000).
	MaxMessagesPerDevice int
	// MaxBytesPerDevice is the most record bytes one device may have
	// queued (default 1 MiB).
	MaxBytesPerDevice int64
	// MaxTotalBytes bounds the queue of all devices together (default
	// 256 MiB): its record bytes, and queuedMsgSize more for each
	// message, what the queue holds in memory for it beside its record.
	// The records are on disk as well, so this bounds the disk they take
	// too.
	MaxTotalBytes int64
	// MaxAge is how long a message may wait (default 1 h).
	MaxAge time.Duration
	// RestoreDelay holds back the release of messages restored at
	// start-up, so that backend consumers have reconnected when they
	// come: a message released to no subscriber is gone. 0 releases
	// them as soon as their windows admit them.
	RestoreDelay time.Duration
}

func (l *DeferLimits) validate() error {
	switch {
	case l.MaxMessagesPerDevice < 0:
		return fmt.Errorf("%w: DeferLimits.MaxMessagesPerDevice must be >= 0 (got %d)", ErrInvalidOptions, l.MaxMessagesPerDevice)
	case l.MaxBytesPerDevice < 0:
		return fmt.Errorf("%w: DeferLimits.MaxBytesPerDevice must be >= 0 (got %d)", ErrInvalidOptions, l.MaxBytesPerDevice)
	case l.MaxTotalBytes < 0:
		return fmt.Errorf("%w: DeferLimits.MaxTotalBytes must be >= 0 (got %d)", ErrInvalidOptions, l.MaxTotalBytes)
	case l.MaxAge < 0:
		return fmt.Errorf("%w: DeferLimits.MaxAge must be >= 0 (got %q)", ErrInvalidOptions, l.MaxAge.String())
	case l.RestoreDelay < 0:
		return fmt.Errorf("%w: DeferLimits.RestoreDelay must be >= 0 (got %q)", ErrInvalidOptions, l.RestoreDelay.String())
	}
	return nil
}

func (l DeferLimits) withDefaults() DeferLimits {
	if l.MaxMessagesPerDevice == 0 {
		l.MaxMessagesPerDevice = DefaultDeferMaxMessagesPerDevice
	}
	if l.MaxBytesPerDevice == 0 {
		l.MaxBytesPerDevice = DefaultDeferMaxBytesPerDevice
	}
	if l.MaxTotalBytes == 0 {
		l.MaxTotalBytes = DefaultDeferMaxTotalBytes
	}
	if l.MaxAge == 0 {
		l.MaxAge = DefaultDeferMaxAge
	}
	return l
}

const (
	deferShards = 64
	// minReleaseSleep is the shortest sleep of the release loop, so
	// that a device refused again and again (a window about to admit)
	// cannot make the loop spin.
	minReleaseSleep = time.Millisecond
	// deleteInterval is the shortest time between two deletions of
	// released messages from the store; keys released meanwhile are
	// deleted together.
	deleteInterval = 100 * time.Millisecond
	// releaseListener is the listener name of the inline client that
	// publishes released messages.
	releaseListener = "deferred"
	// storeErrorLogWindow bounds how often store failures are logged.
	storeErrorLogWindow = time.Minute
)

// deferrer is the deferral queue: per device, the messages held for
// later in enqueue order, in memory and in the store; a min-heap of the
// devices by the instant their window next admits a message; and the
// release round that publishes what is due.
//
// Locking: a device's queue is guarded by its shard's lock; the heap by
// heapMu, taken after a shard lock, never before. A release round holds
// roundMu (rounds never overlap) and a shard lock only to look at or
// update one device's queue, never while publishing or touching the
// store. Enqueues to the store run under no lock.
type deferrer struct {
	store  DeferStore
	limits DeferLimits
	table  Limiter // the throttle's limiter: releases decide on the same windows
	// leases is the table whose leases a release waits for (lease.go).
	leases   *devicelimit.Table
	resolver *devicelimit.Resolver
	clock    devicelimit.Clock
	log      *slog.Logger
	logs     *logLimiter // shared with the throttle
	// publish delivers a released message as its device; expiry is the
	// remaining message expiry interval. Called only by release rounds.
	publish func(device string, m *deferredMsg, expiry uint32) error
	// live returns the device's newest live connection, nil when it
	// has none (throttle.liveConn).
	live func(device string) *connInfo
	// decideAs decides a message on topic of size bytes as a publish
	// of connection c at now would be (throttle.decideRelease).
	decideAs func(c *connInfo, topic string, size int, now devicelimit.Tick) devicelimit.Decision

	seed   maphash.Seed
	shards [deferShards]deferShard

	seq atomic.Uint64 // the last sequence number handed out
	// budget is the record bytes queued or reserved by enqueues in
	// progress, checked against MaxTotalBytes.
	budget                 atomic.Int64
	queueMsgs, queueBytes  atomic.Int64
	loaded                 bool         // guarded by the Server's mu
	failures               atomic.Int64 // store and release failures since the last log line
	deferred, released     atomic.Uint64
	expired, overflowed    atomic.Uint64
	damaged                atomic.Int64  // messages set aside as damaged, held in the store
	rounds, visited, wakes atomic.Uint64 // for tests: release rounds, devices popped, loop wake-ups

	heapMu sync.Mutex
	due    dueHeap
	wake   chan struct{} // capacity 1: the heap has a new earliest device

	roundMu sync.Mutex
	batch   []batchItem // a round's messages of one device; guarded by roundMu

	delMu   sync.Mutex
	dels    []DeferredKey // released or expired, not yet deleted from the store
	delKick chan struct{} // capacity 1
	flushMu sync.Mutex    // one store deletion at a time
}

type deferShard struct {
	mu     sync.Mutex
	queues map[string]*devQueue
	_      [40]byte
}

// devQueue is one device's queue, of its own quota or of one of its
// topic classes: a device's messages keep their order within each.
// All fields are guarded by the shard's lock except due, guarded by
// heapMu.
type devQueue struct {
	// key names the queue in its shard and in the store: the device ID,
	// or for a class's queue the ID, a NUL and the class's name (queueKey).
	key, device, class string
	// msgs are the stored messages in enqueue order. A release round
	// publishes a prefix without the lock and removes it after, so a
	// message published meanwhile sees a non-empty queue and waits its
	// turn behind them.
	msgs  []queuedMsg
	bytes int64 // record bytes of msgs
	// writers counts enqueues in progress (reserved, not yet stored);
	// reserved their bytes. While writers > 0 the queue is not empty.
	writers   int
	reserved  int64
	scheduled bool // in the heap, or in a release round that will push it back
	due       devicelimit.Tick
}

// queuedMsg is what the queue keeps of a message in memory: the record
// and the fields a release round needs before decoding it.
type queuedMsg struct {
	seq      uint64
	enqueued devicelimit.Tick
	expiry   uint32 // MQTT 5 message expiry interval, seconds; 0 none
	size     int    // payload bytes, what a byte window counts
	quota    devicelimit.Quota
	rec      []byte
}

// queuedMsgSize is what a queued message holds in memory beside its
// record: its queuedMsg, counted against MaxTotalBytes with the record.
// (Its topic is not kept apart: a release reads it from the record.)
const queuedMsgSize = int64(unsafe.Sizeof(queuedMsg{}))

func (q *devQueue) idle() bool { return len(q.msgs) == 0 && q.writers == 0 }

func newDeferrer(store DeferStore, limits DeferLimits, h *throttle) *deferrer {
	d := &deferrer{
		store:    store,
		limits:   limits.withDefaults(),
		table:    h.limiter,
		leases:   h.table,
		resolver: h.resolver,
		live:     h.liveConn,
		decideAs: h.decideRelease,
		clock:    h.clock,
		log:      h.log,
		logs:     h.logs,
		seed:     maphash.MakeSeed(),
		wake:     make(chan struct{}, 1),
		delKick:  make(chan struct{}, 1),
	}
	for i := range d.shards {
		d.shards[i].queues = make(map[string]*devQueue)
	}
	return d
}

// shard returns the device's shard, where all its queues are.
func (d *deferrer) shard(device string) *deferShard {
	return &d.shards[maphash.String(d.seed, device)%deferShards]
}

// queueKey names the queue of device's messages in class ("": its own
// quota's). A device ID holds no NUL (an MQTT string cannot).
func queueKey(device, class string) string {
	if class == "" {
		return device
	}
	return device + "\x00" + class
}

// splitQueueKey is the inverse of queueKey.
func splitQueueKey(key string) (device, class string) {
	device, class, _ = strings.Cut(key, "\x00")
	return device, class
}

// outcome is what deferPublish did with a publish.
type outcome uint8

const (
	outAllowed  outcome = iota // admitted now: forward it
	outDeferred                // stored: ack 0x00, forward nothing
	outFull                    // the queue is full: refuse like policy drop
	outFailed                  // the store failed: refuse like policy drop
	outTooLarge                // larger than a byte window ever admits: refuse like policy drop
)

// String says why a deferral was refused, for logs and reason strings.
func (o outcome) String() string {
	switch o {
	case outFull:
		return "deferral queue full"
	case outFailed:
		return "deferral failed"
	case outTooLarge:
		return "payload larger than a byte window ever admits: not deferred"
	}
	return "deferred"
}

// deferPublish handles a publish of a device in topic class class (""
// for its own quota) under policy defer at now. A device with messages
// of the class queued (or being stored) queues behind them even when its
// windows have room, so its messages keep their order in each class;
// otherwise the windows decide, and a message over the limit is stored
// with the quota rec (the rule's, or the class's). It returns once the
// message is durable. dec is the windows' refusal, when they refused.
func (d *deferrer) deferPublish(cl *mqtt.Client, pk *packets.Packet, device, class string, rec, q devicelimit.Quota, now devicelimit.Tick) (outcome, devicelimit.Decision) {
	if limit, ok := q.TooLarge(len(pk.Payload)); ok {
		// No window would ever admit it: not queued, where it would
		// hold up the device's later messages for ever.
		return outTooLarge, devicelimit.Decision{Limit: limit, TooLarge: true}
	}
	key := queueKey(device, class)
	sh := d.shard(device)
	sh.mu.Lock()
	dq := sh.queues[key]
	idle := dq == nil || dq.idle()
	sh.mu.Unlock()
	var dec devicelimit.Decision
	// Decide outside the lock: with windows in Redis a decision is a
	// round trip, which must not hold up the shard's other devices.
	if idle {
		if dec = d.table.AllowClassAt(device, class, q, len(pk.Payload), now); dec.Allowed {
			return outAllowed, dec
		}
	}
	sh.mu.Lock()
	if dq = sh.queues[key]; dq == nil {
		dq = &devQueue{key: key, device: device, class: class}
		sh.queues[key] = dq
	}
	dq.writers++ // from here the queue is not idle: later publishes queue behind this one
	sh.mu.Unlock()

	m := deferredFromPacket(pk, cl.Properties.ProtocolVersion, now, rec)
	record := deferredRecord(&m)
	n := int64(len(record))

	sh.mu.Lock()
	ok := d.fits(dq, dq.writers, n) && d.reserve(n+queuedMsgSize)
	if !ok {
		dq.writers--
		d.forgetIfIdle(sh, dq)
		sh.mu.Unlock()
		d.overflowed.Add(1)
		return outFull, dec
	}
	dq.reserved += n
	seq := d.seq.Add(1)
	sh.mu.Unlock()

	sealDeferred(record, key, seq)
	err := d.store.Enqueue(key, seq, record)

	sh.mu.Lock()
	dq.writers--
	dq.reserved -= n
	if err != nil {
		d.budget.Add(-(n + queuedMsgSize))
		d.forgetIfIdle(sh, dq)
		sh.mu.Unlock()
		d.overflowed.Add(1)
		d.failed("deferred message not stored", err, device)
		return outFailed, dec
	}
	dq.msgs = append(dq.msgs, queuedMsg{seq: seq, enqueued: now, expiry: m.MessageExpiry, size: len(m.Payload), quota: rec, rec: record})
	dq.bytes += n
	d.queueMsgs.Add(1)
	d.queueBytes.Add(n)
	if !dq.scheduled {
		// Due when the refusal said; queued behind others, at once: the
		// release round decides (outside the lock) and reschedules.
		d.schedule(dq, now.Add(dec.RetryAfter), true)
	}
	sh.mu.Unlock()
	d.deferred.Add(1)
	return outDeferred, dec
}

// queueLen returns the number of messages device has queued, in its own
// queue and its classes'. The classes' queues are found by a walk of the
// device's shard: for the admin API, not for publishes.
func (d *deferrer) queueLen(device string) int {
	sh := d.shard(device)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	n := 0
	if dq := sh.queues[device]; dq != nil {
		n = len(dq.msgs)
	}
	for key, dq := range sh.queues {
		if dq.device == device && key != device {
			n += len(dq.msgs)
		}
	}
	return n
}

// reserve takes n bytes of the global budget, or reports that they
// would exceed it.
// fits reports whether dq, with writers messages being stored (this
// one's included), takes a message of n record bytes within the
// per-device bounds (the budget of all devices is reserve's). Called
// with the shard's lock held.
func (d *deferrer) fits(dq *devQueue, writers int, n int64) bool {
	return len(dq.msgs)+writers <= d.limits.MaxMessagesPerDevice && dq.bytes+dq.reserved+n <= d.limits.MaxBytesPerDevice
}

func (d *deferrer) reserve(n int64) bool {
	for {
		cur := d.budget.Load()
		if cur+n > d.limits.MaxTotalBytes {
			return false
		}
		if d.budget.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// forgetIfIdle removes an idle, unscheduled queue from its shard. Called
// with the shard's lock held.
func (d *deferrer) forgetIfIdle(sh *deferShard, dq *devQueue) {
	if dq.idle() && !dq.scheduled {
		delete(sh.queues, dq.key)
	}
}

// load restores the queues from the store, due RestoreDelay after now, and continues
// the sequence numbers after the highest stored. It runs once, before
// the server listens; a second call does nothing.
func (d *deferrer) load(now devicelimit.Tick) (messages, devices int, err error) {
	if d.loaded {
		return 0, 0, nil
	}
	var (
		queues   []*devQueue
		cur      *devQueue
		maxSeq   uint64
		invalid  int
		total    int64
		buckets  = d.table.Buckets()
		fallback = d.resolver.Default()
	)
	var damaged []DeferredKey
	err = d.store.LoadDeferred(func(key string, seq uint64, rec []byte) error {
		err := checkDeferred(rec, key, seq)
		var m deferredMsg
		if err == nil {
			m, err = decodeStored(rec)
		}
		if err != nil {
			// Never released as if sound: set aside below, counted and
			// named. The queue's later messages go on.
			d.log.Error("deferred message damaged: set aside, not released", "device", key, "seq", seq, "err", err)
			damaged = append(damaged, DeferredKey{Device: key, Seq: seq})
			maxSeq = max(maxSeq, seq)
			return nil
		}
		if cur == nil || cur.key != key {
			device, class := splitQueueKey(key)
			cur = &devQueue{key: key, device: device, class: class}
			queues = append(queues, cur)
		}
		q := m.Quota
		if q.Validate(buckets) != nil {
			// Stored under a configuration with more buckets: the table
			// would refuse the quota for ever.
			q = fallback
			invalid++
		}
		cur.msgs = append(cur.msgs, queuedMsg{seq: seq, enqueued: m.Enqueued, expiry: m.MessageExpiry, size: len(m.Payload), quota: q, rec: bytes.Clone(rec)})
		cur.bytes += int64(len(rec))
		total += int64(len(rec))
		maxSeq = max(maxSeq, seq)
		messages++
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("restore deferred messages: %w", err)
	}
	setAside, err := d.store.SetAsideDeferred(damaged)
	if err != nil {
		return 0, 0, fmt.Errorf("restore deferred messages: %w", err)
	}
	d.damaged.Store(int64(setAside))
	if len(damaged) > 0 || setAside > 0 {
		d.log.Error("damaged deferred messages set aside in the data file", "set_aside_now", len(damaged), "held", setAside)
	}
	if invalid > 0 {
		d.log.Warn("deferred messages restored under the default quota: their quota is invalid for the configured bucket count",
			"messages", invalid, "buckets", buckets, "default", fallback.String())
	}
	for _, dq := range queues {
		sh := d.shard(dq.device)
		sh.mu.Lock()
		sh.queues[dq.key] = dq
		d.schedule(dq, now.Add(d.limits.RestoreDelay), false) // Start starts the loop after
		sh.mu.Unlock()
	}
	d.seq.Store(max(d.seq.Load(), maxSeq))
	held := total + int64(messages)*queuedMsgSize
	d.budget.Add(held)
	d.queueMsgs.Add(int64(messages))
	d.queueBytes.Add(total)
	d.loaded = true
	if held > d.limits.MaxTotalBytes {
		d.log.Warn("restored deferral queue exceeds its byte budget; new deferrals are refused until it drains",
			"bytes", total, "messages", messages, "held_bytes", held, "max_total_bytes", d.limits.MaxTotalBytes)
	}
	return messages, len(queues), nil
}
