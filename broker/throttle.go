package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/forward"
	"github.com/devicegate/devicegate/internal/topk"
)

// Stats counts the throttle hook's decisions since New. Every publish
// that reaches the hook is counted exactly once.
type Stats struct {
	// Allowed counts device publishes admitted.
	Allowed uint64
	// Dropped counts publishes over quota that were dropped (policy drop,
	// and policy defer without a DeferStore), and those a device
	// disconnected by policy had sent before its connection ended.
	Dropped uint64
	// Disconnected counts connections closed for a publish over quota
	// (policy disconnect).
	Disconnected uint64
	// WouldRefuse counts the publishes a quota in shadow mode let
	// through that it would have refused (counted in Allowed too).
	WouldRefuse uint64
	// WouldRefuseByRule splits WouldRefuse by the configured rule the
	// device matched ("" for the default quota), whichever quota (the
	// rule's, a topic class's, an override) was in shadow mode.
	WouldRefuseByRule map[string]uint64
	// Blocks counts the blocks made (automatic blocking); Blocked is the
	// number of devices blocked now.
	Blocks  uint64
	Blocked int
	// Deferred counts publishes stored in the deferral queue (policy
	// defer): over quota, or behind messages of the device already
	// queued.
	Deferred uint64
	// Overflowed counts publishes that could not be deferred, refused
	// like policy drop: the device's queue or the total byte budget was
	// full, or the store failed.
	Overflowed uint64
	// Released counts deferred messages published.
	Released uint64
	// Groups counts, by configured group (its label: the name, or the
	// template), the messages of its devices its windows admitted,
	// refused, and would refuse in shadow mode (indexed by
	// GroupAdmitted, GroupRefused, GroupWouldRefuse).
	Groups map[string][3]uint64
	// Refusals counts the publishes the windows refused (policies drop
	// and disconnect), by topic class ("" for the device's own quota)
	// and by what refused them: a message window, a byte window, or a
	// payload larger than a byte window (indexed by RefusedMessages,
	// RefusedBytes, RefusedTooLarge).
	Refusals map[string][3]uint64
	// Expired counts deferred messages dropped unpublished: they waited
	// longer than DeferLimits.MaxAge or their MQTT 5 message expiry.
	Expired uint64
	// QueueMessages and QueueBytes are the deferral queue's current
	// size: messages, and bytes of their stored records.
	QueueMessages, QueueBytes int64
	// DeferredDamaged is how many deferred messages the store holds set
	// aside as damaged (a checksum that does not match, a record that
	// does not decode): never released.
	DeferredDamaged int64
	// Inline counts server-injected publishes, passed through uncounted;
	// released deferred messages are in Released, not here.
	Inline uint64
	// ConnectedClients is the number of client connections whose
	// session is established (authenticated, about to get or past their
	// CONNACK) and not yet ended. One whose CONNACK write failed is
	// counted until the next sweep.
	ConnectedClients int64
	// Subscriptions is the number of subscriptions the broker holds, of
	// connected clients and of kept sessions.
	Subscriptions int64
	// SlowSubscriberDrops counts messages not delivered to a subscriber
	// because it already had its maximum of messages in flight
	// (unacknowledged, Limits.MaxInflight) or of writes queued
	// (Limits.MaxPendingWrites): it reads or acks too slowly.
	SlowSubscriberDrops uint64
}

// mochi's two publish outcomes, boxed once: a packets.Code converted to
// error allocates, and mochi compares them by value (errors.Is).
var (
	errIgnore error = packets.CodeSuccessIgnore // ack normally, forward nothing
	errReject error = packets.ErrRejectPacket   // no ack, forward nothing
)

// refusalLogWindow bounds how often a refused client ID is logged.
const refusalLogWindow = time.Minute

// throttle is the mochi hook that enforces device quotas on publishes;
// see docs/design.md, "Data flow of one publish". mochi calls OnPublish
// concurrently across clients and in order per client.
type throttle struct {
	mqtt.HookBase

	// statusSubacks counts the status watches whose SUBACK is still to
	// go: the status hook wants OnPacketSent only while it is not 0.
	statusSubacks atomic.Int64

	srv     *mqtt.Server // to refuse a CONNECT
	table   *devicelimit.Table
	limiter Limiter // decides publishes: Options.Limiter, else table
	// prelease: the table decides and takes leases, so a session's
	// start asks its device's first leases (preleaseOf).
	prelease bool
	// cohorts spaces the CONNACKs a lease commit lets go (cohort.go).
	cohorts  cohorts
	resolver *devicelimit.Resolver
	clock    devicelimit.Clock
	identity devicelimit.Identity
	log      *slog.Logger
	// logs limits logging: one line per device (or refused client) per
	// window, whatever the device's message rate.
	logs *logLimiter
	// wills is the one will per device per window beyond the quota.
	wills willAllowance
	// consumers gates the delivery of admitted publishes while a backend
	// consumer's queue is full (consumers.go); nil without consumers.
	consumers *consumerSet
	// fwd takes admitted messages for the upstreams; nil without any.
	fwd Forwarder
	// inlines publish locally what an acker acknowledged (forwardack.go);
	// nil without fwd.
	inlines chan *mqtt.Client

	// def is the deferral queue; nil without a DeferStore, and policy
	// defer then drops.
	def *deferrer

	// conns is the broker's registry of connections, shared with the
	// auth hook; the throttle removes entries (forget) and sweeps it.
	conns *registry

	// devices indexes the live connections by device, and keeps the
	// devices' last-seen instants; see devState. Guarded by devMu; only
	// connects, disconnects, sweeps and status reads take it.
	devMu   sync.Mutex
	devices map[string]*devState
	// connected counts the connections in conns.
	connected atomic.Int64

	// throttled, when not nil, records every refusal by device.
	throttled *topk.Tracker

	allowed, dropped, disconnected, inline atomic.Uint64
	// wouldRefuse counts the publishes a quota in shadow mode let
	// through that it would have refused.
	wouldRefuse atomic.Uint64
	// wouldRefuseByRule splits wouldRefuse by the rule the device
	// matched ("" for the default quota): the rules configured at New,
	// and those a reload added from the reload on (wouldRefuseOf).
	// Guarded by wouldRefuseMu; a connection holds its rule's counter.
	wouldRefuseMu     sync.Mutex
	wouldRefuseByRule map[string]*atomic.Uint64
	// blocks are the devices blocked for their refusals.
	blocks *blocks
	// refusals counts refusals by the windows, by topic class ("" for
	// the device's own quota; the classes are the configuration's, so
	// the map is fixed) and by what refused (refusalKinds).
	refusals map[string]*[3]atomic.Uint64
	// groups counts the groups' outcomes by label (group.go); fixed at
	// start.
	groups map[string]*groupStats
	// groupsSeen holds the membership of every group a device joined
	// since start, by name (group.go).
	groupsSeen sync.Map
	// groupsSince is the rules' generation at the last reload
	// (Server.Reconfigure): Groups lists the joins of lookups begun at
	// it or after.
	groupsSince atomic.Uint64
	// groupJoined is Options.GroupJoined.
	groupJoined func(devicelimit.Membership)
	// remaps are the auth hook's (packetids.go): the throttle, the last
	// hook to encode, writes them into the acks.
	remaps *idRemaps
}

// connInfo is what a connection's publishes need and what cannot change
// while it is connected: client ID and username are fixed by CONNECT.
type connInfo struct {
	device             string
	clientID, username string
	// rv is what the configuration gives the device: its rule, classes
	// and group, looked up at CONNECT and again at a reload
	// (Server.Reconfigure). Read it once per message (rules).
	rv       atomic.Pointer[ruleView]
	closing  atomic.Bool      // set when policy disconnect hung up
	remote   string           // the connection's remote address
	protocol byte             // MQTT protocol version
	since    devicelimit.Tick // when it was established
	// dev is the device's entry in throttle.devices; nil for a
	// connInfo computed for an uncached client.
	dev *devState

	// Touched only by OnPublish, which mochi runs in order per client,
	// so without a lock: caches that spare a refusal flood the work of
	// a refusal already seen.
	// quietUntil is when the log limiter could next admit a "device
	// throttled" line for the device; before it, no need to ask.
	quietUntil devicelimit.Tick
	// fullQuietUntil is the same for the "deferral refused" line.
	fullQuietUntil devicelimit.Tick
	// reason is the last MQTT 5 refusal reason string, for
	// reasonQuota and reasonRetry.
	reason      string
	reasonQuota devicelimit.Quota
	reasonRetry time.Duration
	reasonBy    devicelimit.Decision // the refusing window's limit and unit
	// ack acknowledges forwarded QoS 1 publishes once durable
	// (forwardack.go); nil until the first.
	ack *acker
	// fb is the device's feedback on its acks (feedback.go); nil
	// unless the connection is MQTT 5.
	fb *feedbackState
	// status is the connection's watch on its status topic (status.go);
	// nil until it first subscribes to it.
	status atomic.Pointer[statusWatch]
}

// ID returns the hook's ID.
func (h *throttle) ID() string { return "devicegate-throttle" }

// Provides reports the hook methods the throttle implements.
func (h *throttle) Provides(b byte) bool { return throttleEvents[b] } // hookevents.go

// Init checks the hook was built by New.
func (h *throttle) Init(any) error {
	if h.srv == nil || h.table == nil || h.resolver == nil || h.clock == nil || h.logs == nil || h.log == nil {
		return fmt.Errorf("%w: throttle hook not built by broker.New", ErrInvalidOptions)
	}
	return nil
}

// remoteHost returns the host of a remote address "host:port", or the
// address itself when it has no port.
func remoteHost(remote string) string {
	if host, _, err := net.SplitHostPort(remote); err == nil {
		return host
	}
	return remote
}

// decide counts a message of size bytes in class, under quota q,
// against its device's windows, and its group's when it has one (whose
// quota it sets in gq): the decision, and whether the group refused. In
// shadow mode a refusal is counted and logged as one and the message
// allowed all the same. The quotas go by pointer: a Quota is 160 bytes,
// and copying three of them cost an allowed publish 14 %.
func (h *throttle) decide(cl *mqtt.Client, c *connInfo, class string, q, gq *devicelimit.Quota, size int, now devicelimit.Tick) (devicelimit.Decision, bool) {
	d, byGroup, shadowed := h.judge(c, class, q, gq, size, now)
	if shadowed {
		h.logThrottled(cl, c, class, refusing(*q, *gq, byGroup), d, byGroup, now)
	}
	return d, byGroup
}

// judge is decide without its log line, for callers that do not run in
// c's OnPublish (a release round): it also reports whether the message
// was let through in shadow mode.
func (h *throttle) judge(c *connInfo, class string, q, gq *devicelimit.Quota, size int, now devicelimit.Tick) (d devicelimit.Decision, byGroup, shadowed bool) {
	shadow := q.Shadow
	if c.rules().group.Key == "" {
		d = h.limiter.AllowClassAt(c.device, class, *q, size, now)
	} else {
		d, *gq, byGroup, shadow = h.decideGroup(c, class, *q, size, now)
	}
	if !d.Allowed && shadow {
		// Shadow mode: refused as an enforcing quota would (so not
		// counted in its windows), let through all the same.
		h.wouldRefuse.Add(1)
		c.rules().wouldRefuse.Add(1)
		d.Allowed, shadowed = true, true
	}
	return d, byGroup, shadowed
}

// wouldRefuseOf returns the would-refuse counter of the rule named rule
// ("" for the default quota), made on first use: a rule a reload added
// counts from then on. Called once per connection and per reload.
func (h *throttle) wouldRefuseOf(rule string) *atomic.Uint64 {
	h.wouldRefuseMu.Lock()
	defer h.wouldRefuseMu.Unlock()
	r := h.wouldRefuseByRule[rule]
	if r == nil {
		r = new(atomic.Uint64)
		h.wouldRefuseByRule[rule] = r
	}
	return r
}

// OnPublish counts the publish against its device's window and applies
// the quota's policy when the window is full. The only errors it returns
// are packets.CodeSuccessIgnore (ack normally, forward nothing) and
// packets.ErrRejectPacket (no ack, forward nothing; used only after the
// hook has written the ack or closed the connection itself). Any other
// packets.Code would be published anyway for MQTT 3.1.1 and QoS 0, and
// acked as a PUBACK even for QoS 2.
func (h *throttle) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline {
		// Server-injected (deferred releases, acknowledged forwarded
		// messages, $SYS): counted when they first arrived, or never
		// subject to a quota.
		if cl.Net.Listener == forwardedListener {
			return pk, nil
		}
		if cl.Net.Listener != releaseListener {
			h.inline.Add(1)
			return pk, nil
		}
		// A released deferred message: it was acknowledged when stored,
		// so a failure here can only be logged, once per window (the
		// release loop keeps it in the queue only until it publishes it).
		if err := h.forward(cl.ID, &pk); err != nil && h.logs.allow(logForward, "release", refusalLogWindow) {
			h.log.Error("released message not forwarded upstream", "topic", pk.TopicName, "error", err)
		}
		return pk, nil
	}
	c := h.cachedInfo(cl)
	// Only an admitted forwarded QoS 1 publish may go to the acker;
	// anything else acknowledged or published here first waits for it.
	queueable := h.fwd != nil && h.inlines != nil && pk.FixedHeader.Qos == 1 && c.dev != nil
	if !queueable {
		c.ack.barrier()
	}
	now := h.clock.Now()
	if c.dev != nil {
		c.dev.seen(now)
	}
	if c.closing.Load() {
		// Read after policy disconnect hung up, before the connection
		// ended: refused uncounted, whatever the window says now.
		h.dropped.Add(1)
		h.refused(c, pk.TopicName, "", refusalClosing, now)
		return pk, errReject
	}
	v := c.rules()
	class, q := h.resolver.ClassAt(c.device, v.rule, v.ruleName, v.classes, pk.TopicName, now)
	var gq devicelimit.Quota
	if w := c.status.Load(); w != nil {
		defer h.statusAfter(cl, c, w, class, &q, &gq, now) // status.go
	}
	// A device in a group is never deferred: a deferred message
	// released while its device is not connected goes without its
	// group's windows (releaseDevice; policy defer drops).
	if h.defers(&q, v) {
		c.ack.barrier()
		err := h.deferPublish(cl, &pk, c, class, q, now)
		if err == nil {
			h.consumers.enter(cl)
		}
		return pk, err
	}
	var d devicelimit.Decision
	byGroup := false
	if v.group.Key == "" && !q.Shadow {
		// decide's commonest case, without its call (measured 8 % of
		// an allowed publish).
		d = h.limiter.AllowClassAt(c.device, class, q, len(pk.Payload), now)
	} else {
		d, byGroup = h.decide(cl, c, class, &q, &gq, len(pk.Payload), now)
	}
	if c.fb != nil && pk.FixedHeader.Qos > 0 && (q.Feedback.Mode != devicelimit.FeedbackOff || v.group.Key != "") {
		h.prepareFeedback(c, c.fb, class, &q, &gq, len(pk.Payload), pk.PacketID, &d, now)
	}
	if d.Allowed {
		if !leased(h.table, d.Lease) {
			c.ack.barrier()
			return pk, h.admitFailed(cl, &pk, errLease)
		}
		var err error
		if queueable {
			err = h.admitQueued(cl, c, &pk)
		} else {
			err = h.admit(cl, c.device, &pk)
		}
		if err == nil {
			h.consumers.enter(cl) // mochi delivers it now (consumers.go)
			c.recordOutcome(SeriesAdmitted, useOf(&d), now)
		}
		return pk, err
	}
	c.ack.barrier()
	return pk, h.refuse(cl, pk, c, class, q, gq, byGroup, d, now)
}

// admit lets a publish the window admitted through: forwarded to the
// upstreams, if any, and counted allowed. When the forward logs cannot
// take it, it is counted dropped instead (its window count stays: the
// window admitted it) and dropped without an acknowledgement (errReject),
// so a QoS 1 or 2 device sends it again; the failure is logged once per
// window.
func (h *throttle) admit(cl *mqtt.Client, device string, pk *packets.Packet) error {
	err := h.forward(device, pk)
	if err == nil {
		h.allowed.Add(1)
		return nil
	}
	return h.admitFailed(cl, pk, err)
}

// admitFailed handles an admitted publish the forward logs did not take
// (see admit).
func (h *throttle) admitFailed(cl *mqtt.Client, pk *packets.Packet, err error) error {
	h.dropped.Add(1)
	if errors.Is(err, forward.ErrFull) {
		// overflow refuse_new: MQTT 5 is told (0x97); an MQTT 3.1.1
		// QoS 1/2 publish gets no ack (acked would say it will get
		// upstream), and a QoS 0 one is dropped.
		if wantsRefusal(cl, *pk) {
			reason := "forward log full: the upstream is away; retry later"
			if errors.Is(err, forward.ErrLowSpace) {
				reason = "the gateway's disk is at its free-space floor: retry later"
			}
			return h.quotaExceeded(cl, *pk, reason)
		}
		if pk.FixedHeader.Qos == 0 {
			return errIgnore
		}
		return errReject
	}
	if h.logs.allow(logForward, "", refusalLogWindow) {
		what := "message not acknowledged: the forward log did not take it"
		if errors.Is(err, errLease) {
			what = "message not acknowledged: its lease was not written to the data file in time"
		}
		h.log.Error(what, "client", cl.ID, "topic", pk.TopicName, "error", err)
	}
	return errReject
}

// admitQueued admits a forwarded QoS 1 publish without waiting for its
// commit: queued in the forward logs and handed to the client's acker,
// which acknowledges it once durable (forwardack.go). A publish no
// upstream takes, or one the logs refuse, goes the way of admit, after
// the acker is idle.
func (h *throttle) admitQueued(cl *mqtt.Client, c *connInfo, pk *packets.Packet) error {
	q, err := h.fwd.ForwardAsync(forwardMessage(c.device, pk))
	if err == nil && !q.None() {
		p := &pendingAck{pk: *pk, durable: q}
		if c.fb != nil {
			p.props = c.fb.copyFeedback(pk.PacketID)
		}
		if h.ackerOf(cl, c).push(p) {
			return errReject // the acker acks and publishes
		}
		err = q.Wait() // the connection is gone: wait here
		if err == nil {
			h.allowed.Add(1)
			return nil
		}
	}
	c.ack.barrier()
	if err == nil { // no upstream takes the topic
		h.allowed.Add(1)
		return nil
	}
	return h.admitFailed(cl, pk, err)
}

// deferPublish applies policy defer: the publish is forwarded when the
// device has nothing queued and its window admits it, and otherwise
// stored before mochi acks it with 0x00 and forwards nothing. A full
// queue, or a store failure, is refused like policy drop.
func (h *throttle) deferPublish(cl *mqtt.Client, pk *packets.Packet, c *connInfo, class string, q devicelimit.Quota, now devicelimit.Tick) error {
	rec := c.rules().rule // stored with the message; an override is looked up again at release
	if class != "" {
		rec = q // the class's quota
	}
	out, d := h.def.deferPublish(cl, pk, c.device, class, rec, q, now)
	if c.fb != nil && pk.FixedHeader.Qos > 0 && q.Feedback.Mode != devicelimit.FeedbackOff {
		// Deferred (stored, acked 0x00) or refused, it is not admitted
		// now: told so, as a refusal.
		var gq devicelimit.Quota
		h.prepareFeedback(c, c.fb, class, &q, &gq, len(pk.Payload), pk.PacketID, &d, now)
	}
	if !d.Allowed && d.Limit > 0 { // the window refused it (else it queued behind others)
		h.logThrottled(cl, c, class, q, d, false, now)
	}
	switch out {
	case outAllowed:
		if !leased(h.table, d.Lease) {
			return h.admitFailed(cl, pk, errLease)
		}
		err := h.admit(cl, c.device, pk)
		if err == nil {
			c.recordOutcome(SeriesAdmitted, useOf(&d), now)
		}
		return err
	case outDeferred:
		c.recordOutcome(SeriesDeferred, 100, now)
		return errIgnore // mochi acks 0x00 (PUBACK, or PUBREC for QoS 2)
	}
	h.refused(c, pk.TopicName, class, out.String(), now)
	if now >= c.fullQuietUntil { // before it the limiter would refuse: skip the key and the lookup
		if ok, retry := h.logs.allowAt(logFull, c.device, q.Shortest(), now); ok {
			h.log.Warn("deferral refused", "device", c.device, "client", cl.ID, "reason", out.String())
		} else {
			c.fullQuietUntil = now.Add(retry)
		}
	}
	if !wantsRefusal(cl, *pk) {
		return errIgnore // as quotaExceeded would, without the reason string
	}
	return h.quotaExceeded(cl, *pk, refusalText("quota exceeded"+ofClass(class), q, out.String()))
}

// stats returns the counters.
func (h *throttle) stats() Stats {
	st := Stats{
		Allowed:      h.allowed.Load(),
		Dropped:      h.dropped.Load(),
		Disconnected: h.disconnected.Load(),
		WouldRefuse:  h.wouldRefuse.Load(),
		Blocks:       h.blocks.made.Load(),
		Blocked:      int(h.blocks.n.Load()),
		Inline:       h.inline.Load(),

		ConnectedClients: h.connected.Load(),
		Refusals:         make(map[string][3]uint64, len(h.refusals)),
	}
	for class, r := range h.refusals {
		st.Refusals[class] = [3]uint64{r[0].Load(), r[1].Load(), r[2].Load()}
	}
	h.wouldRefuseMu.Lock()
	st.WouldRefuseByRule = make(map[string]uint64, len(h.wouldRefuseByRule))
	for rule, r := range h.wouldRefuseByRule {
		st.WouldRefuseByRule[rule] = r.Load()
	}
	h.wouldRefuseMu.Unlock()
	st.Groups = make(map[string][3]uint64, len(h.groups))
	for label, g := range h.groups {
		st.Groups[label] = [3]uint64{g[0].Load(), g[1].Load(), g[2].Load()}
	}
	if d := h.def; d != nil {
		st.Deferred = d.deferred.Load()
		st.Overflowed = d.overflowed.Load()
		st.Released = d.released.Load()
		st.Expired = d.expired.Load()
		st.QueueMessages = d.queueMsgs.Load()
		st.QueueBytes = d.queueBytes.Load()
		st.DeferredDamaged = d.damaged.Load()
	}
	return st
}

// The indexes of Stats.Refusals' counts.
const (
	RefusedMessages = iota
	RefusedBytes
	RefusedTooLarge
)
