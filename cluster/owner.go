package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/devicelimit"
)

// Defaults of OwnerOptions' zero fields.
const (
	DefaultLeaseShare    = 0.5
	DefaultGatewayTTL    = 3 * time.Second
	DefaultFlushInterval = 100 * time.Millisecond
)

// OwnerOptions configure an Owner. Client and Shared are required.
type OwnerOptions struct {
	// Client reaches Redis for claims and checkpoints (the decision
	// client: short timeouts, no retries).
	Client redis.UniversalClient
	// Control reaches Redis for liveness, pub/sub and releases (Client
	// when nil).
	Control redis.UniversalClient
	// Shared decides what owner mode does not: group decisions (their
	// window is shared by devices on many gateways), and the failure
	// policy while this gateway cannot use its leases. Its Prefix and
	// Timeout are the owner's.
	Shared *Limiter
	// ID names this gateway in Redis; random when "". It must be unique
	// among the gateways sharing the Redis and new at every start.
	ID string
	// LeaseShare is the share of each window a checkpoint leases
	// (DefaultLeaseShare when 0): a crash costs a device at most that.
	LeaseShare float64
	// GatewayTTL is how long a gateway's liveness key outlives its last
	// renewal (DefaultGatewayTTL when 0): a dead gateway's devices are
	// served elsewhere after at most that.
	GatewayTTL time.Duration
	// FlushInterval is how often checkpoints of devices running low on
	// their lease are written (DefaultFlushInterval when 0).
	FlushInterval time.Duration
	// Clock times claims made outside a decision (Claim).
	Clock devicelimit.Clock
	// OnLost, when set, is called (on its own goroutine) with a device
	// another gateway took over: close its sessions here.
	OnLost func(device string)
	// Logger receives the failure lines; nil discards.
	Logger *slog.Logger
}

// Owner decides device publishes where the device is connected, in a
// table of its own, with Redis holding each device's owner, fencing
// epoch, last checkpoint and lease (docs/design.md, "Decisions where
// the device is"). It has the decision methods of broker.Limiter. Use
// NewOwner; Close stops it and releases its devices.
type Owner struct {
	rdb, ctl redis.UniversalClient
	shared   *Limiter
	table    *devicelimit.Table
	id       string
	prefix   string
	share    float64
	ttl      time.Duration
	flush    time.Duration
	timeout  time.Duration
	clock    devicelimit.Clock
	onLost   func(string)
	log      *slog.Logger
	multi    bool

	shards [ownShards]ownShard
	start  time.Time
	fence  atomic.Int64 // time.Since(start) until which leases may be used

	pmu     sync.Mutex
	pending []*owned
	wake    chan struct{} // capacity 1: an urgent checkpoint waits
	soon    chan struct{} // capacity 1: pending is no longer empty
	beat    chan struct{} // capacity 1: read the release requests now
	rel     chan struct{} // capacity 1: relq has releases to write
	relMu   sync.Mutex
	relq    []parting
	gen     atomic.Int64 // lapses of the liveness so far

	cmu      sync.Mutex
	claimq   []claimReq
	cstopped bool          // the claimer has stopped: claims fail at once
	cwake    chan struct{} // capacity 1: claimq has claims to run
	sweepNow chan struct{} // capacity 1: sweep the idle grant entries now

	wmu     sync.Mutex
	waiters map[string]chan struct{} // claims waiting for a release

	grants grantTable // group grants (ownergroup.go)
	stats  ownerStats
	stop   chan struct{}
	// done is cancelled with stop: the control calls of the loops
	// (liveness renewals, releases, release requests) end with it, so
	// that Close does not wait out their timeouts.
	done   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	pubsub *redis.PubSub
}

// ownerStats count what an Owner did, for tests and metrics. grants
// counts group grant claims (script calls), grantRefused those Redis
// refused, grantFailed those that failed or were not sent (Redis away);
// grantUnits and grantBack the units granted and given back, by
// devicelimit.Unit.
type ownerStats struct {
	claims, waits, charges, checkpoints, fenced, releases, fallbacks, grants atomic.Uint64
	grantRefused, grantFailed                                                atomic.Uint64
	grantUnits, grantBack                                                    [2]atomic.Uint64
}

const ownShards = 64

type ownShard struct {
	mu sync.RWMutex
	m  map[string]*owned
}

// Device states.
const (
	stClaiming = iota
	stReady
	stLost
	// stParted: given up to the gateway that claimed the device (on its
	// request, or fenced by its claim): a publish still read from its
	// old connection here is refused, neither decided by the failure
	// policy (the new owner counts its window) nor made a claim that
	// takes the device back. The device stays so for the gateway TTL
	// (forgetParted); a new connection of the device here (ClaimSoon,
	// Claim) claims it again at once.
	stParted
)

// infinite is the lease of a unit the device has no window of.
const infinite = int64(1) << 50

// owned is a device this gateway owns (or is claiming).
type owned struct {
	device  string
	ready   chan struct{} // closed once the claim ended (state ready or lost)
	settled atomic.Bool   // ready is closed

	mu    sync.Mutex
	state int
	epoch int64
	// sinceM and sinceB count the quota messages and bytes admitted
	// since the last durable checkpoint over the last span (ownerlease.go);
	// leasedM and leasedB are that checkpoint's lease: admissions keep
	// those counts within it (a checkpoint taken with the counts at c
	// takes c out of them once Redis has it).
	sinceM, sinceB   recent
	leasedM, leasedB int64
	wins             []win
	durWins          int // wins[:durWins] are in the durable checkpoint
	maxSize          int
	// resets counts the operator's resets of its windows here, durReset
	// those a checkpoint Redis accepted covers; while durReset < resets
	// checkpoints carry no lease (a crash charges nothing) and nothing is
	// admitted until one lands. ckErr is the last checkpoint's failure.
	resets, durReset int64
	ckErr            error
	queued           bool
	landed           chan struct{} // closed and renewed at each checkpoint's answer
	gone             chan struct{} // closed once its sessions here are closed (stParted)
	goneOnce         sync.Once
	parted           atomic.Bool // state stParted
}

// NewOwner builds an owner and starts its liveness renewal, its
// checkpoint writer and its listener. It does not wait for Redis.
func NewOwner(opts OwnerOptions) (*Owner, error) {
	switch {
	case opts.Client == nil:
		return nil, fmt.Errorf("%w: Client is nil", ErrInvalidOptions)
	case opts.Shared == nil:
		return nil, fmt.Errorf("%w: Shared is nil", ErrInvalidOptions)
	case opts.LeaseShare < 0 || opts.LeaseShare > 1:
		return nil, fmt.Errorf("%w: LeaseShare must be between 0 and 1 (got %v)", ErrInvalidOptions, opts.LeaseShare)
	case opts.GatewayTTL < 0 || opts.FlushInterval < 0:
		return nil, fmt.Errorf("%w: GatewayTTL and FlushInterval must be >= 0", ErrInvalidOptions)
	}
	if opts.Control == nil {
		opts.Control = opts.Client
	}
	if opts.ID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		opts.ID = hex.EncodeToString(b[:])
	}
	if opts.LeaseShare == 0 {
		opts.LeaseShare = DefaultLeaseShare
	}
	if opts.GatewayTTL == 0 {
		opts.GatewayTTL = DefaultGatewayTTL
	}
	if opts.FlushInterval == 0 {
		opts.FlushInterval = DefaultFlushInterval
	}
	if opts.Clock == nil {
		opts.Clock = devicelimit.NewSystemClock(0)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	table, err := devicelimit.NewTable(opts.Shared.Buckets())
	if err != nil {
		return nil, err
	}
	o := &Owner{
		rdb: opts.Client, ctl: opts.Control, shared: opts.Shared, table: table, id: opts.ID,
		prefix: opts.Shared.prefix, share: opts.LeaseShare, ttl: opts.GatewayTTL, flush: opts.FlushInterval,
		timeout: opts.Shared.timeout, clock: opts.Clock, onLost: opts.OnLost, log: log,
		start: time.Now(), wake: make(chan struct{}, 1), soon: make(chan struct{}, 1), beat: make(chan struct{}, 1), rel: make(chan struct{}, 1), cwake: make(chan struct{}, 1),
		sweepNow: make(chan struct{}, 1),
		waiters:  make(map[string]chan struct{}), stop: make(chan struct{}),
	}
	o.done, o.cancel = context.WithCancel(context.Background())
	_, o.multi = opts.Client.(*redis.Client)
	for i := range o.shards {
		o.shards[i].m = make(map[string]*owned)
	}
	o.pubsub = o.ctl.Subscribe(ctxBackground(), o.prefix+"gwc:"+o.id)
	o.wg.Add(6)
	go o.sweeper()
	go o.claimer()
	go o.releaser()
	go o.heartbeat()
	go o.flusher()
	go o.listen()
	return o, nil
}

// ID returns the gateway's name in Redis.
func (o *Owner) ID() string { return o.id }

// Buckets returns the number of buckets per window.
func (o *Owner) Buckets() int { return o.shared.Buckets() }

// Table returns the owner's table: the windows of the devices it owns.
func (o *Owner) Table() *devicelimit.Table { return o.table }

func (o *Owner) mono() int64 { return int64(time.Since(o.start)) }

// leased reports whether this gateway may decide on its leases: its
// liveness was renewed recently enough that no other gateway takes it
// for dead.
func (o *Owner) leased() bool { return o.mono() < o.fence.Load() }

func (o *Owner) shard(device string) *ownShard {
	var h uint32 = 2166136261
	for i := 0; i < len(device); i++ {
		h = (h ^ uint32(device[i])) * 16777619
	}
	return &o.shards[h%ownShards]
}

// recordKey returns the device's record key: its ID is the hash tag.
func (o *Owner) recordKey(device string) string { return o.prefix + "o:{" + device + "}" }

// AllowAt decides one message of device under the one-window quota q.
func (o *Owner) AllowAt(device string, q devicelimit.Quota, now devicelimit.Tick) devicelimit.Decision {
	return o.AllowClassAt(device, "", q, 0, now)
}

// AllowClassAt decides a message of size bytes of device in class
// under q, in this gateway's table once the device is its own:
// devicelimit.Table.AllowClassAt's contract, with the cluster-wide
// invariant (see Owner).
func (o *Owner) AllowClassAt(device, class string, q devicelimit.Quota, size int, now devicelimit.Tick) devicelimit.Decision {
	var one [1]devicelimit.Limit
	ls := limitsOf(q, &one)
	if d, done := o.shared.precheck(ls, size); done {
		return d
	}
	return o.decide(device, class, q, ls, size, now, groupPart{}).Decision
}

// AllowGroupAt decides a message of a device in a group: its own
// windows in this gateway's table, its group's (shared by devices on
// every gateway) on this gateway's grant of the group's windows
// (ownergroup.go), claimed from the group's keys alone, which on Redis
// Cluster live in the group's own slot. The device's windows
// stay locked meanwhile, so its part cannot change between the two:
// devicelimit.Table.AllowGroupAt's contract (both parts enforced or both
// in shadow mode: counted in both or neither; one in shadow mode: the
// enforced part first, the other only when it admitted), except that a
// refusal by the device's own windows does not ask the group.
func (o *Owner) AllowGroupAt(device, class string, q devicelimit.Quota, groupKey string, gq devicelimit.Quota, size int, now devicelimit.Tick) devicelimit.GroupDecision {
	var one, gone [1]devicelimit.Limit
	ls, gls := limitsOf(q, &one), limitsOf(gq, &gone)
	if d, done := o.shared.precheck(ls, size); done {
		return devicelimit.GroupDecision{Decision: d}
	}
	if d, done := o.shared.precheck(gls, size); done {
		return devicelimit.GroupDecision{Decision: d, Group: true}
	}
	return o.decide(device, class, q, ls, size, now, groupPart{key: groupKey, q: gq})
}

// groupPart is the group's side of a decision; key "" for none. It
// holds no slice of its windows: the key leaks (the failure policy's
// table keeps it), which would move such a slice's array to the heap.
type groupPart struct {
	key string
	q   devicelimit.Quota
}

// decide takes a device's decision (and its group's, g) once the device
// is this gateway's and its lease covers the message.
func (o *Owner) decide(device, class string, q devicelimit.Quota, ls []devicelimit.Limit, size int, now devicelimit.Tick, g groupPart) devicelimit.GroupDecision {
	quota := len(class) == 0 || class[0] != 0
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if !o.leased() {
			return o.fallbackGroup(device, class, q, ls, size, now, g)
		}
		d, waited := o.get(device, now)
		if !d.mu.TryLock() {
			d.mu.Lock()
			waited = true
		}
		if waited && !o.leased() {
			// The fence passed while this waited for the device's claim
			// or its lock (a group's Redis call holds it up to the
			// timeout): past it no lease of this gateway's counts. Not
			// asked again when nothing was waited for: the check above
			// is as recent as a check here would be, less a map lookup,
			// and the clock read is a tenth of an owned decision.
			d.mu.Unlock()
			return o.fallbackGroup(device, class, q, ls, size, now, g)
		}
		if d.state == stParted {
			d.mu.Unlock()
			return o.parted(d, ls)
		}
		if d.state != stReady {
			// The claim failed: this message takes the policy, the next
			// one claims it again.
			d.mu.Unlock()
			o.forget(d)
			return o.fallbackGroup(device, class, q, ls, size, now, g)
		}
		known := d.know(class, ls)
		var spanM, spanB time.Duration
		var m, b int64
		if quota {
			spanM, spanB = d.span(devicelimit.Messages), d.span(devicelimit.Bytes)
			m = d.since(&d.sinceM, now, spanM, 1)
			b = d.since(&d.sinceB, now, spanB, int64(size))
		}
		if known && (!quota || (m <= d.leasedM && b <= d.leasedB)) {
			var v devicelimit.GroupDecision
			counted := false
			if g.key == "" {
				v.Decision = o.table.AllowClassAt(device, class, q, size, now)
				counted = v.Allowed
			} else {
				v, counted = o.withGroup(device, class, q, ls, size, now, g)
			}
			if counted && quota {
				if spanM > 0 {
					d.sinceM.add(now, spanM, 1)
				}
				if spanB > 0 {
					d.sinceB.add(now, spanB, int64(size))
				}
				if !d.queued && (d.leasedM-m < o.leaseM(d)/4 || d.leasedB-b < o.leaseB(d)/4) {
					o.enqueue(d, false)
				}
			}
			d.mu.Unlock()
			return v
		}
		// A window new to the checkpoint, or the lease used up: wait for
		// the next checkpoint; none is written while Redis rests after a
		// failure: the policy decides at once.
		d.maxSize = max(d.maxSize, size)
		if o.shared.health.skip() {
			o.enqueue(d, false)
			d.mu.Unlock()
			return o.fallbackGroup(device, class, q, ls, size, now, g)
		}
		o.enqueue(d, true)
		ch := d.landed
		d.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(o.timeout)
		}
		select {
		case <-ch:
		case <-timer.C:
			return o.fallbackGroup(device, class, q, ls, size, now, g)
		}
	}
}

// parted refuses a publish of a device another gateway took over: one
// its old connection here sent before it was closed. It waits until that
// connection is closed (the releaser closes it within controlTimeout of
// the release request, once its release is written or failed; a second
// more for the releaser to get to it), so that the device learns
// nothing from the refusal (an MQTT 3.1.1 device would take policy
// drop's PUBACK for a success) and sends the message again where it is
// now.
func (o *Owner) parted(d *owned, ls []devicelimit.Limit) devicelimit.GroupDecision {
	t := time.NewTimer(controlTimeout + time.Second)
	defer t.Stop()
	select {
	case <-d.gone:
	case <-t.C:
	case <-o.stop:
	}
	first := ls[0].N
	return devicelimit.GroupDecision{Decision: devicelimit.Decision{Limit: first, Count: first, RetryAfter: failRetryAfter}}
}

// goneHere marks d's sessions here closed.
func (d *owned) goneHere() { d.goneOnce.Do(func() { close(d.gone) }) }

// part marks d given up to another gateway (d.mu held).
func (d *owned) part() {
	d.state = stParted
	d.parted.Store(true)
}

// forgetParted forgets d, given up to another gateway, once the
// publishes its old connection here sent before it was closed have been
// decided (refused): the gateway's TTL later.
func (o *Owner) forgetParted(d *owned) { time.AfterFunc(o.ttl, func() { o.forget(d) }) }

// withGroup decides a device's part in the table and its group's in
// Redis (the device's windows locked by the caller), and reports whether
// the device's windows counted the message (its lease's business).
func (o *Owner) withGroup(device, class string, q devicelimit.Quota, ls []devicelimit.Limit, size int, now devicelimit.Tick, g groupPart) (devicelimit.GroupDecision, bool) {
	var dv, gv devicelimit.Verdict
	order := devicelimit.OrderOf(q, g.q)
	switch order {
	case devicelimit.BothParts:
		if dv = o.table.PeekAllAt(device, class, ls, size, now); dv.Allowed {
			if gv = o.groupVerdict(g, size, now); gv.Allowed {
				dv = o.table.AllowAllAt(device, class, ls, size, now)
			}
		}
	case devicelimit.DeviceFirst:
		if dv = o.table.AllowAllAt(device, class, ls, size, now); dv.Allowed {
			gv = o.groupVerdict(g, size, now)
		}
	default: // GroupFirst
		if gv = o.groupVerdict(g, size, now); gv.Allowed {
			dv = o.table.AllowAllAt(device, class, ls, size, now)
		}
	}
	counted := dv.Allowed && (order != devicelimit.BothParts || gv.Allowed)
	return devicelimit.CombineGroup(dv, gv), counted
}

// limitsOf returns q's windows, its one window in *one when it has one.
func limitsOf(q devicelimit.Quota, one *[1]devicelimit.Limit) []devicelimit.Limit {
	if q.NWindows == 0 {
		one[0] = devicelimit.Limit{Unit: devicelimit.Messages, N: q.Limit, Window: q.Window}
		return one[:]
	}
	return q.Windows[:min(max(q.NWindows, 0), devicelimit.MaxWindows)]
}

// know reports whether every window of ls in class is in d's durable
// checkpoint; it adds those d does not know yet (d.mu held) and keeps
// the limits current.
func (d *owned) know(class string, ls []devicelimit.Limit) bool {
	ok := true
	var seen [2]int
	for _, l := range ls {
		k := seen[l.Unit]
		seen[l.Unit]++
		i := 0
		for i < len(d.wins) && (d.wins[i].class != class || d.wins[i].unit != l.Unit || d.wins[i].k != k) {
			i++
		}
		if i == len(d.wins) {
			d.wins = append(d.wins, win{class: class, unit: l.Unit, k: k, n: l.N, length: l.Window})
		}
		d.wins[i].n, d.wins[i].length = l.N, l.Window
		ok = ok && i < d.durWins
	}
	return ok
}

// leaseM and leaseB are the lease a checkpoint of d grants now (d.mu
// held): the share of its smallest quota window of each unit, at least
// one message and the largest message seen; infinite for a unit it has
// no window of.
func (o *Owner) leaseM(d *owned) int64 { return o.lease(d, devicelimit.Messages) }
func (o *Owner) leaseB(d *owned) int64 { return o.lease(d, devicelimit.Bytes) }

func (o *Owner) lease(d *owned, u devicelimit.Unit) int64 {
	l := infinite
	for _, w := range d.wins {
		if w.unit == u && w.quota() {
			floor := 1
			if u == devicelimit.Bytes {
				floor = d.maxSize
			}
			l = min(l, int64(max(int(float64(w.n)*o.share), floor, 1)))
		}
	}
	return l
}

// fallbackGroup decides under the failure policy, the shared limiter's.
func (o *Owner) fallbackGroup(device, class string, q devicelimit.Quota, ls []devicelimit.Limit, size int, now devicelimit.Tick, g groupPart) devicelimit.GroupDecision {
	o.stats.fallbacks.Add(1)
	if g.key == "" {
		return devicelimit.GroupDecision{Decision: o.shared.fallback(device, class, ls, size, now)}
	}
	return o.shared.fallbackGroup(device, class, q, g.key, g.q, size, now)
}

// StandingAt fills s with the device's windows from this gateway's
// table and its group's from what its grant entry of the group holds,
// or a look at the group's grant rings in Redis (about one per bucket;
// ownergroupstanding.go).
func (o *Owner) StandingAt(device, class string, q devicelimit.Quota, groupKey string, gq devicelimit.Quota, size int, refused bool, now devicelimit.Tick, s *devicelimit.Standing) {
	o.table.StandingAt(device, class, q, "", gq, size, refused, now, s)
	if groupKey == "" {
		return
	}
	var gs devicelimit.Standing
	o.groupStanding(groupKey, gq, size, refused, now, &gs)
	for _, w := range gs.Windows[:gs.N] {
		w.Group, w.Shadow, w.Class = true, gq.Shadow, ""
		s.Add(w)
	}
	s.Sort()
}

// Owns reports whether this gateway decides for device now.
func (o *Owner) Owns(device string) bool {
	sh := o.shard(device)
	sh.mu.RLock()
	d := sh.m[device]
	sh.mu.RUnlock()
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.state == stReady
}
