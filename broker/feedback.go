package broker

// Device feedback (docs/device-feedback.md): an MQTT 5 CONNACK carries
// the device's contract, RateLimit-Policy, and a PUBACK or PUBREC its
// standing, RateLimit, as user properties, per the quota's feedback
// mode; a changed contract rides on the next acknowledgement. mochi
// builds the CONNACK and most acks itself: OnPacketEncode adds the
// properties to them as they are encoded.

import (
	"bytes"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
)

// feedbackState is an MQTT 5 connection's feedback. Apart from pending,
// it is touched by OnPublish and by the encode of the CONNACK and of
// the acks mochi writes in OnPublish's wake: one goroutine at a time
// (mochi's read loop, after the CONNACK's write).
type feedbackState struct {
	// What the last RateLimit-Policy was made of: the resolver's
	// generation, the rule view, and when an override in it expires
	// (0: none); a change in any of them means a look at the contract.
	gen   uint64
	rv    *ruleView
	until devicelimit.Tick
	// policy is the RateLimit-Policy last sent ("" when feedback was
	// off).
	policy []byte
	// announce is a changed contract the next ack carries.
	announce bool
	standing devicelimit.Standing
	buf      []byte
	// pending is the user properties of the ack of one packet ID, for
	// the encode that writes it (the forward acker writes its acks from
	// a goroutine of its own, with properties taken from here).
	pending atomic.Pointer[ackFeedback]
}

// ackFeedback is the user properties an ack of packet id carries.
type ackFeedback struct {
	id    uint16
	props []packets.UserProperty
}

// feedbackOn reports whether a device under q in a group under gq (a
// group's feedback counts only when it sets one) is told anything.
func feedbackOn(q, gq *devicelimit.Quota, grouped bool) bool {
	return q.Feedback.On() || grouped && gq.Feedback.Mode != devicelimit.FeedbackDefault && gq.Feedback.On()
}

// contract computes the device's RateLimit-Policy at now into f.buf and
// records what it was made of; it returns the field, nil when the
// device's feedback is off.
func (h *throttle) contract(c *connInfo, f *feedbackState, now devicelimit.Tick) []byte {
	f.gen, f.rv = h.resolver.Generation(), c.rules()
	v := f.rv
	q, classes, until := h.resolver.ContractAt(c.device, v.rule, v.ruleName, v.classes, now)
	var gq devicelimit.Quota
	var gp *devicelimit.Quota
	if v.group.Key != "" {
		gq = h.resolver.GroupQuotaAt(v.group.Membership, now)
		gp = &gq
		if o, ok := h.resolver.Override(v.group.Key, now); ok && o.ExpiresAt != 0 && (until == 0 || o.ExpiresAt < until) {
			until = o.ExpiresAt
		}
	}
	f.until = until
	if !feedbackOn(&q, &gq, gp != nil) {
		return nil
	}
	f.buf = devicelimit.AppendPolicy(f.buf[:0], q, classes, gp)
	return f.buf
}

// contractChanged reports whether the contract may have changed since
// the last RateLimit-Policy: a cheap test of what it was made of.
func (h *throttle) contractChanged(c *connInfo, f *feedbackState, now devicelimit.Tick) bool {
	return f.gen != h.resolver.Generation() || f.rv != c.rules() || f.until != 0 && now >= f.until
}

// feedbackRefused reports whether decision d refused its message, or
// would have in shadow mode (let through, with its retry-after).
func feedbackRefused(d *devicelimit.Decision) bool {
	return !d.Allowed || d.RetryAfter > 0 || d.TooLarge
}

// prepareFeedback makes the user properties of the ack of a QoS 1 or 2
// publish of an MQTT 5 device, decided as d in class under q (gq its
// group's quota, when it has a group): RateLimit when its feedback
// mode asks, RateLimit-Policy when its contract changed. They wait in
// f.pending for the ack's encode.
func (h *throttle) prepareFeedback(c *connInfo, f *feedbackState, class string, q, gq *devicelimit.Quota, size int, id uint16, d *devicelimit.Decision, now devicelimit.Tick) {
	f.pending.Store(nil)
	if h.contractChanged(c, f, now) {
		if p := h.contract(c, f, now); !bytes.Equal(p, f.policy) {
			f.policy = append(f.policy[:0], p...)
			f.announce = len(p) > 0
		}
	}
	v := c.rules()
	grouped := v.group.Key != ""
	refused := feedbackRefused(d)
	gf := gq.Feedback
	if !grouped || gf.Mode == devicelimit.FeedbackDefault {
		gf = devicelimit.Feedback{Mode: devicelimit.FeedbackOff}
	}
	var props []packets.UserProperty
	if q.Feedback.Looks(refused) || gf.Looks(refused) {
		s := &f.standing
		h.limiter.StandingAt(c.device, class, *q, v.group.Key, *gq, size, refused, now, s)
		if s.N > 0 && (q.Feedback.Wants(refused, s) || gf.Wants(refused, s)) {
			f.buf = s.AppendRateLimit(f.buf[:0])
			props = append(props, packets.UserProperty{Key: devicelimit.RateLimitProperty, Val: string(f.buf)})
		}
	}
	if f.announce {
		f.announce = false
		props = append(props, packets.UserProperty{Key: devicelimit.PolicyProperty, Val: string(f.policy)})
	}
	if props != nil {
		f.pending.Store(&ackFeedback{id: id, props: props})
	}
}

// takeFeedback returns the user properties waiting for the ack of
// packet id, and forgets them.
func (f *feedbackState) takeFeedback(id uint16) []packets.UserProperty {
	p := f.pending.Load()
	if p == nil || p.id != id || !f.pending.CompareAndSwap(p, nil) {
		return nil
	}
	return p.props
}

// OnPacketEncode adds the device's feedback to its MQTT 5 CONNACK
// (RateLimit-Policy) and to the PUBACK or PUBREC of a publish
// (prepareFeedback's properties), after any the ack inherits.
func (h *throttle) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	switch pk.FixedHeader.Type {
	case packets.Connack, packets.Puback, packets.Pubrec:
	default:
		return pk
	}
	if cl.Properties.ProtocolVersion != 5 {
		return pk
	}
	c := h.conns.info(cl)
	if c == nil || c.fb == nil {
		return pk
	}
	var props []packets.UserProperty
	if pk.FixedHeader.Type == packets.Connack {
		if pk.ReasonCode != 0 {
			return pk
		}
		f := c.fb
		if p := h.contract(c, f, h.clock.Now()); p != nil {
			f.policy = append(f.policy[:0], p...)
			props = []packets.UserProperty{{Key: devicelimit.PolicyProperty, Val: string(p)}}
		}
	} else if props = c.fb.takeFeedback(pk.PacketID); props == nil {
		return pk
	}
	// A new slice: the ack may share the publish's properties.
	user := make([]packets.UserProperty, 0, len(pk.Properties.User)+len(props))
	pk.Properties.User = append(append(user, pk.Properties.User...), props...)
	if pk.FixedHeader.Type == packets.Puback && pk.ReasonCode == packets.CodeGrantedQos1.Code {
		// mochi acks QoS 1 with its "granted QoS 1" code, 0x01, which
		// it writes only when the ack has properties: no PUBACK reason
		// code of MQTT 5 (3.4.2.1). Success is 0x00.
		pk.ReasonCode = packets.CodeSuccess.Code
	}
	return pk
}
