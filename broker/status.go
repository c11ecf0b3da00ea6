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
// most one a second, and only after a publish of its own (or its
// subscription), so status never outnumbers the traffic it describes.
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

// statusHook sends the status messages. Safe for concurrent use; it
// costs a client that does not watch its status one atomic load per
// packet sent or processed.
type statusHook struct {
	mqtt.HookBase
	t *throttle
	// n counts the entries of watch, read without mu.
	n atomic.Int64
	// mu guards watch; every publish looks itself up while anyone
	// watches, read-locked.
	mu    sync.RWMutex
	watch map[*mqtt.Client]*statusWatch
}

// statusWatch is a client subscribed to its status.
type statusWatch struct {
	mu sync.Mutex
	// suback is the packet ID of the SUBSCRIBE whose SUBACK is still to
	// go; the first status follows it. 0 when none is awaited.
	suback uint16
	// last is when the last status went; sent says one did.
	last devicelimit.Tick
	sent bool
	// refusals is the device's refusal count at its last publish;
	// refusing says that publish was refused; below that some window
	// was under its threshold then.
	refusals uint64
	refusing bool
	below    bool
	// due is a status held back by statusEvery, sent at the next
	// publish after it.
	due bool
}

func newStatusHook(t *throttle) *statusHook {
	return &statusHook{t: t, watch: make(map[*mqtt.Client]*statusWatch)}
}

// ID returns the hook's ID.
func (h *statusHook) ID() string { return "devicegate-status" }

// Provides reports the hook methods statusHook implements.
func (h *statusHook) Provides(b byte) bool {
	switch b {
	case mqtt.OnSubscribed, mqtt.OnUnsubscribed, mqtt.OnPacketSent, mqtt.OnPacketProcessed, mqtt.OnDisconnect:
		return true
	}
	return false
}

// OnSubscribed starts watching a client granted its status topic; its
// first status goes after the SUBACK (OnPacketSent).
func (h *statusHook) OnSubscribed(cl *mqtt.Client, pk packets.Packet, codes []byte) {
	for i, f := range pk.Filters {
		if i < len(codes) && codes[i] < 0x80 && isStatusTopicOf(f.Filter, cl.ID) {
			h.mu.Lock()
			w := h.watch[cl]
			if w == nil {
				w = new(statusWatch)
				h.watch[cl] = w
				h.n.Add(1)
			}
			h.mu.Unlock()
			w.mu.Lock()
			w.suback = pk.PacketID
			w.mu.Unlock()
			return
		}
	}
}

// OnUnsubscribed stops watching a client that left its status topic.
func (h *statusHook) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	for _, f := range pk.Filters {
		if isStatusTopicOf(f.Filter, cl.ID) {
			h.forget(cl)
		}
	}
}

// OnDisconnect stops watching a client gone.
func (h *statusHook) OnDisconnect(cl *mqtt.Client, _ error, _ bool) {
	if h.n.Load() > 0 {
		h.forget(cl)
	}
}

func (h *statusHook) forget(cl *mqtt.Client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.watch[cl]; ok {
		delete(h.watch, cl)
		h.n.Add(-1)
	}
}

func (h *statusHook) watching(cl *mqtt.Client) *statusWatch {
	if h.n.Load() == 0 {
		return nil
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.watch[cl]
}

// OnPacketSent sends a watching client its first status once the SUBACK
// granting it went.
func (h *statusHook) OnPacketSent(cl *mqtt.Client, pk packets.Packet, _ []byte) {
	if pk.FixedHeader.Type != packets.Suback {
		return
	}
	w := h.watching(cl)
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.suback == 0 || w.suback != pk.PacketID {
		return
	}
	w.suback = 0
	now := h.t.clock.Now()
	st, ok := h.t.deviceStatus(cl, now)
	if !ok {
		return
	}
	w.refusals, w.below = st.refusals, st.below
	h.send(cl, w, &st, now)
}

// OnPacketProcessed looks at a watching client's standing after each of
// its publishes, and sends a status when it crossed its threshold going
// down or was refused for the first time since it was last admitted.
func (h *statusHook) OnPacketProcessed(cl *mqtt.Client, pk packets.Packet, _ error) {
	if pk.FixedHeader.Type != packets.Publish || cl.Net.Inline {
		return
	}
	w := h.watching(cl)
	if w == nil {
		return
	}
	now := h.t.clock.Now()
	st, ok := h.t.deviceStatus(cl, now)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	refused := st.refusals > w.refusals
	if refused && !w.refusing || st.below && !w.below {
		w.due = true
	}
	w.refusals, w.refusing, w.below = st.refusals, refused, st.below
	if w.due && (!w.sent || now.Sub(w.last) >= statusEvery) {
		h.send(cl, w, &st, now)
	}
}

// send writes st to cl (w.mu held).
func (h *statusHook) send(cl *mqtt.Client, w *statusWatch, st *deviceStatus, now devicelimit.Tick) {
	w.due, w.sent, w.last = false, true, now
	if !st.on {
		return // feedback off: the device is told nothing
	}
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish},
		TopicName:   StatusPrefix + cl.ID,
		Payload:     st.json(),
	}
	if err := cl.WritePacket(pk); err != nil {
		h.t.log.Debug("status not sent", "client", cl.ID, "error", err)
	}
}
