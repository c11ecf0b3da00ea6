package broker

import (
	mqtt "github.com/mochi-mqtt/server/v2"
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

// Provides reports OnWill.
func (w *willHook) Provides(b byte) bool { return b == mqtt.OnWill }

// OnWill lets the will through when the device's window admits it.
// Over the quota, whatever the policy, one will per window still goes
// out, so that presence tracking sees a device go offline (say after a
// policy disconnect); further ones are dropped. mochi cannot be told not
// to publish a will (an error keeps the original), so the hook returns
// one with an empty topic, which mochi's topic index matches to no
// subscriber, and without retain, so nothing is stored either.
func (w *willHook) OnWill(cl *mqtt.Client, will mqtt.Will) (mqtt.Will, error) {
	if w.t.admitWill(cl) {
		return will, nil
	}
	return mqtt.Will{}, nil
}

// admitWill counts cl's will against its device's window (or its
// override) and reports whether it may be published.
func (h *throttle) admitWill(cl *mqtt.Client) bool {
	c := h.cachedInfo(cl)
	now := h.clock.Now()
	class, q := h.resolver.ClassAt(c.device, c.rule, c.ruleName, c.classes, cl.Properties.Will.TopicName, now)
	if h.limiter.AllowClassAt(c.device, class, q, len(cl.Properties.Will.Payload), now).Allowed {
		h.allowed.Add(1)
		return true
	}
	h.refused(c.device, now)
	if h.wills.take(c.device, q.Shortest(), now) {
		return true // the one will per window beyond the quota
	}
	h.dropped.Add(1)
	return false
}
