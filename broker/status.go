package broker

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/auth"
	"github.com/devicegate/devicegate/devicelimit"
)

// The status topic (docs/device-feedback.md): a device that gets no
// RateLimit on its acknowledgements (MQTT 3.1.1, QoS 0) subscribes to
// StatusPrefix + its client ID and the gateway sends it, and it alone,
// a JSON status (statusjson.go) at QoS 0, not retained: when it
// subscribes, when one of its windows falls below its quota's feedback
// threshold, and at its first refusal since it was last admitted; at
// most one a second, and never more than its own publishes: the first
// SUBSCRIBE of a connection gets one, any later status needs a publish
// of the device's since the last, so status never outnumbers the
// traffic it describes (a SUBSCRIBE repeated 100 times gets one).
// Nobody publishes under statusRoot, and nobody but the device
// subscribes to its status (statusACL).
const (
	statusRoot = "$devicegate/"
	// StatusPrefix begins a device's status topic; its client ID ends it.
	StatusPrefix = statusRoot + "status/"
)

// statusEvery is the shortest gap between two status messages to one
// device.
const statusEvery = time.Second

// statusACL decides the topic ACL for a topic or filter under statusRoot
// (decided false for any other): no client publishes there, a shared
// subscription there is refused, and a client subscribes only to its
// own status topic, exactly (MQTT 5 SUBACK 0x87, 3.1.1 0x80). It does
// not allocate.
func statusACL(cl *mqtt.Client, topic string, write bool) (allowed, decided bool) {
	t := topic
	if f := sharedTopicFilter(topic); f != "" {
		t = f
	}
	if !strings.HasPrefix(t, statusRoot) {
		return false, false
	}
	return !write && t == topic && isStatusTopicOf(topic, cl.ID), true
}

// isStatusTopicOf reports whether topic is the status topic of client
// ID id, without building it. A client ID that is not one topic level
// (auth.ValidDevice: empty, or holding '/', '+', '#' or NUL) has no
// status topic: as a filter, "#" or "x/+" after StatusPrefix would be a
// wildcard over other clients' status topics.
func isStatusTopicOf(topic, id string) bool {
	return auth.ValidDevice(id) && len(topic) == len(StatusPrefix)+len(id) &&
		strings.HasPrefix(topic, StatusPrefix) && topic[len(StatusPrefix):] == id
}

// statusHook starts and stops a client's watch on its status and sends
// the status that follows a SUBACK; the throttle sends those that
// follow a publish (statusAfter). A watch lives on the connection's own
// state (connInfo.status), so a publish finds it without a lookup.
type statusHook struct {
	mqtt.HookBase
	t *throttle
}

// statusWatch is a connection that subscribed to its status topic; it
// stays with the connection, through unsubscribes, so that the limits
// hold across them.
type statusWatch struct {
	// on says the client is subscribed now.
	on atomic.Bool
	mu sync.Mutex
	// suback is the packet ID of the SUBSCRIBE whose SUBACK is still to
	// go; the status it asks for follows it. 0 when none is awaited.
	suback uint16
	// last is when the last status went; sent says one did; published
	// says the device published since.
	last      devicelimit.Tick
	sent      bool
	published bool
	// refusals is the device's refusal count at its last publish;
	// refusing says that publish was refused; below that a window of
	// its message was under its quota's threshold then.
	refusals uint64
	refusing bool
	below    bool
	// due is a status held back by the limits, sent at the next publish
	// they allow.
	due bool
	// standing is statusAfter's scratch.
	standing devicelimit.Standing
}

func newStatusHook(t *throttle) *statusHook { return &statusHook{t: t} }

// ID returns the hook's ID.
func (h *statusHook) ID() string { return "devicegate-status" }

// Provides reports the hook methods statusHook implements; OnPacketSent
// only while a SUBACK that a status follows is still to go. mochi v2.7.9
// asks Provides at every call (hooks.go), and calls OnPacketSent after
// every packet it writes with the whole packet (800 bytes) copied: most
// of what this hook would cost a delivered message.
func (h *statusHook) Provides(b byte) bool {
	switch b {
	case mqtt.OnSubscribed, mqtt.OnUnsubscribed:
		return true
	case mqtt.OnPacketSent:
		return h.t.statusSubacks.Load() > 0
	}
	return false
}

// OnSubscribed starts watching a client granted its status topic; the
// status it asks for goes after the SUBACK (OnPacketSent).
func (h *statusHook) OnSubscribed(cl *mqtt.Client, pk packets.Packet, codes []byte) {
	for i, f := range pk.Filters {
		if i < len(codes) && codes[i] < 0x80 && isStatusTopicOf(f.Filter, cl.ID) {
			c := h.t.conns.info(cl)
			if c == nil {
				return
			}
			w := c.status.Load()
			if w == nil {
				c.status.CompareAndSwap(nil, new(statusWatch))
				w = c.status.Load()
			}
			w.mu.Lock()
			if w.suback == 0 {
				h.t.statusSubacks.Add(1)
			}
			w.suback = pk.PacketID
			w.mu.Unlock()
			w.on.Store(true)
			return
		}
	}
}

// OnUnsubscribed stops watching a client that left its status topic.
func (h *statusHook) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	for _, f := range pk.Filters {
		if isStatusTopicOf(f.Filter, cl.ID) {
			if c := h.t.conns.info(cl); c != nil {
				if w := c.status.Load(); w != nil {
					w.on.Store(false)
				}
			}
		}
	}
}

// OnPacketSent sends a watching client its status once the SUBACK
// granting it went: the first on the connection at once; a later one
// only when the device published since the last status and a second
// has passed, else with its next publish that the limits allow.
func (h *statusHook) OnPacketSent(cl *mqtt.Client, pk packets.Packet, _ []byte) {
	if pk.FixedHeader.Type != packets.Suback {
		return
	}
	c := h.t.conns.info(cl)
	if c == nil {
		return
	}
	w := c.status.Load()
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.suback == 0 || w.suback != pk.PacketID {
		return
	}
	w.suback = 0
	h.t.statusSubacks.Add(-1)
	now := h.t.clock.Now()
	if w.sent && !w.allowed(now) {
		w.due = true
		return
	}
	st, ok := h.t.deviceStatus(cl, now)
	if !ok {
		return
	}
	w.refusals, w.below = st.refusals, st.below
	h.t.sendStatus(cl, w, &st, now)
}

// allowed reports whether a status may go at now after the last (w.mu
// held): the device published since, a second ago or more.
func (w *statusWatch) allowed(now devicelimit.Tick) bool {
	return w.published && now.Sub(w.last) >= statusEvery
}

// statusAfter follows a publish of a device that watches its status
// (the throttle's OnPublish, after its decision): a status when the
// device was refused for the first time since it was last admitted, or
// when a window that bounds its message (class, under q; its group's
// under gq) fell below the quota's feedback threshold. Only then is the
// status computed; otherwise it reads the message's windows once
// (without allocating) and an atomic counter.
func (h *throttle) statusAfter(cl *mqtt.Client, c *connInfo, w *statusWatch, class string, q, gq *devicelimit.Quota, now devicelimit.Tick) {
	if !w.on.Load() {
		return
	}
	var refusals uint64
	if c.dev != nil {
		refusals = c.dev.history.refusals.Load()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.published = true
	refused := refusals > w.refusals
	w.refusals = refusals
	below := false
	if pct := statusThreshold(q.Feedback); pct > 0 {
		h.limiter.StandingAt(c.device, class, *q, c.rules().group.Key, *gq, 0, false, now, &w.standing)
		below = w.standing.Below(pct)
	}
	if refused && !w.refusing || below && !w.below {
		w.due = true
	}
	w.refusing, w.below = refused, below
	if !w.due || w.sent && now.Sub(w.last) < statusEvery {
		return
	}
	if st, ok := h.deviceStatus(cl, now); ok {
		h.sendStatus(cl, w, &st, now)
	}
}

// statusThreshold is the share of a window's quota (percent) under
// which feedback f sends a status; 0 for none.
func statusThreshold(f devicelimit.Feedback) int {
	switch f = f.Effective(); f.Mode {
	case devicelimit.FeedbackBelow:
		return int(f.Below)
	case devicelimit.FeedbackAlways:
		return 100
	}
	return 0
}

// sendStatus writes st to cl (w.mu held).
func (h *throttle) sendStatus(cl *mqtt.Client, w *statusWatch, st *deviceStatus, now devicelimit.Tick) {
	w.due, w.sent, w.published, w.last = false, true, false, now
	if !st.on {
		return // feedback off: the device is told nothing
	}
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish},
		TopicName:   StatusPrefix + cl.ID,
		Payload:     st.json(),
	}
	if err := cl.WritePacket(pk); err != nil {
		h.log.Debug("status not sent", "client", cl.ID, "error", err)
	}
}

// forgetSuback takes a leaving connection's awaited SUBACK out of the
// count (throttle.forget): one client gone before its SUBACK would
// otherwise keep OnPacketSent, and its copy of every packet, for good.
func (t *throttle) forgetSuback(c *connInfo) {
	w := c.status.Load()
	if w == nil {
		return
	}
	w.mu.Lock()
	if w.suback != 0 {
		w.suback = 0
		t.statusSubacks.Add(-1)
	}
	w.mu.Unlock()
}
