package broker

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
)

// willHook charges a will against its device's quota when mochi is about
// to publish it. mochi publishes a will straight to the subscribers,
// past OnPublish, so without this hook a device over its quota could get
// one uncounted message through per dropped connection: reconnect with a
// will, drop the socket, repeat.
type willHook struct {
	mqtt.HookBase
	t *throttle
}

// ID returns the hook's ID.
func (w *willHook) ID() string { return "devicegate-will" }

// Provides reports OnWill and OnWillSent.
func (w *willHook) Provides(b byte) bool { return b == mqtt.OnWill || b == mqtt.OnWillSent }

// OnWill lets the will through when the device's window admits it.
// Over the quota, whatever the policy, one will per window still goes
// out, so that presence tracking sees a device go offline (say after a
// policy disconnect); further ones are dropped. mochi cannot be told not
// to publish a will (an error keeps the original), so the hook returns
// one with an empty topic, which mochi's topic index matches to no
// subscriber, and without retain, so nothing is stored either.
//
// A will mochi publishes now (no will delay) waits at the consumers'
// gate like a device's publish, on the client's own goroutine
// (consumers.go): a mass disconnect is a burst of wills. A delayed will
// is published later by mochi's loop, past every hook, and does not.
func (w *willHook) OnWill(cl *mqtt.Client, will mqtt.Will) (mqtt.Will, error) {
	if !w.t.admitWill(cl) {
		return mqtt.Will{}, nil
	}
	if will.WillDelayInterval == 0 {
		w.t.consumers.enter(cl)
	}
	return will, nil
}

// OnWillSent ends the delivery of a will published at once. A delayed
// will's OnWillSent runs on mochi's loop, with whatever client holds
// the ID by then; it took no place in the gate.
func (w *willHook) OnWillSent(cl *mqtt.Client, pk packets.Packet) {
	if pk.Connect.WillProperties.WillDelayInterval != 0 {
		return
	}
	if pc, ok := cl.Net.Conn.(*protoConn); ok {
		pc.leave()
	}
}

// admitWill counts cl's will as a publish of its device: against the
// device's windows (or its override) and its group's, shadow mode
// letting it through; and reports whether it may be published.
func (h *throttle) admitWill(cl *mqtt.Client) bool {
	c := h.cachedInfo(cl)
	now := h.clock.Now()
	w := &cl.Properties.Will
	v := c.rules()
	class, q := h.resolver.ClassAt(c.device, v.rule, v.ruleName, v.classes, w.TopicName, now)
	var gq devicelimit.Quota
	if d, _ := h.decide(cl, c, class, &q, &gq, len(w.Payload), now); d.Allowed {
		if !leased(h.table, d.Lease) {
			h.dropped.Add(1) // counted, not published: its lease is not on disk
			return false
		}
		h.allowed.Add(1)
		return true
	}
	h.refused(c, w.TopicName, class, refusalWill, now)
	if h.wills.take(c.device, q.Shortest(), now) {
		return true // the one will per window beyond the quota
	}
	h.dropped.Add(1)
	return false
}
