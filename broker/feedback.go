package broker

// Device feedback (docs/device-feedback.md): an MQTT 5 CONNACK carries
// the device's contract, RateLimit-Policy, and a PUBACK or PUBREC its
// standing, RateLimit, as user properties, per the quota's feedback
// mode; a changed contract rides on the next acknowledgement. mochi
// builds the CONNACK and most acks itself: OnPacketEncode adds the
// properties to them as they are encoded.

import (
	"bytes"
	"strings"
	"unsafe"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
)

// feedbackState is an MQTT 5 connection's feedback. It is touched only
// from the connection's read loop: OnPublish, and the encode of the
// CONNACK and of the acks written there (mochi's, and quotaExceeded's).
// The forward acker writes its acks from a goroutine of its own, with
// properties copied out at OnPublish (ackerOrigin marks them).
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
	buf      []byte // contract's scratch
	rl       []byte // the RateLimit of the pending ack
	// The user properties the ack of packet ackID carries, when ackN >
	// 0: their strings are views of rl and policy, valid until the next
	// publish (the ack is encoded before mochi reads it).
	ackID uint16
	ackN  int
	props [2]packets.UserProperty
}

// ackerOrigin marks the acks the forward acker writes (forwardack.go):
// their properties are their own, set when they were queued.
const ackerOrigin = "devicegate-acker"

// view returns b as a string without copying: valid while b is.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

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
// mode asks, RateLimit-Policy when its contract changed. They wait in f
// for the ack's encode (takeFeedback). It allocates nothing once its
// buffers have grown.
func (h *throttle) prepareFeedback(c *connInfo, f *feedbackState, class string, q, gq *devicelimit.Quota, size int, id uint16, d *devicelimit.Decision, now devicelimit.Tick) {
	f.ackN = 0
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
	n := 0
	if q.Feedback.Looks(refused) || gf.Looks(refused) {
		s := &f.standing
		h.limiter.StandingAt(c.device, class, *q, v.group.Key, *gq, size, refused, now, s)
		if s.N > 0 && (q.Feedback.Wants(refused, s) || gf.Wants(refused, s)) {
			f.rl = s.AppendRateLimit(f.rl[:0])
			f.props[n] = packets.UserProperty{Key: devicelimit.RateLimitProperty, Val: view(f.rl)}
			n++
		}
	}
	if f.announce {
		f.announce = false
		f.props[n] = packets.UserProperty{Key: devicelimit.PolicyProperty, Val: view(f.policy)}
		n++
	}
	f.ackID, f.ackN = id, n
}

// takeFeedback returns the user properties waiting for the ack of
// packet id, and forgets them; they are views valid until the next
// publish.
func (f *feedbackState) takeFeedback(id uint16) []packets.UserProperty {
	if f.ackN == 0 || f.ackID != id {
		return nil
	}
	n := f.ackN
	f.ackN = 0
	return f.props[:n]
}

// copyFeedback is takeFeedback for an ack written later, elsewhere:
// the properties copied.
func (f *feedbackState) copyFeedback(id uint16) []packets.UserProperty {
	props := f.takeFeedback(id)
	if props == nil {
		return nil
	}
	out := make([]packets.UserProperty, len(props))
	for i, p := range props {
		out[i] = packets.UserProperty{Key: p.Key, Val: strings.Clone(p.Val)}
	}
	return out
}

// OnPacketEncode announces the topic alias maximum in an MQTT 5
// CONNACK (alias.go), adds the device's feedback to its MQTT 5 CONNACK
// (RateLimit-Policy) and to the PUBACK or PUBREC of a publish
// (prepareFeedback's properties), keeps a DISCONNECT from an MQTT 3.1.1
// client (silentDisconnect), and, last, gives the acks of a publish
// moved to another packet ID the client's own (packetids.go; the
// feedback waits under the moved one). It is the gateway's only hook on
// mochi's encode: mochi copies the whole packet (800 bytes) into and
// out of every hook that provides OnPacketEncode, for every packet it
// writes, so a publish delivered leaves here at once.
func (h *throttle) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	switch pk.FixedHeader.Type {
	case packets.Connack, packets.Puback, packets.Pubrec, packets.Pubcomp, packets.Disconnect:
	default:
		return pk
	}
	announceAliasMaximum(h.srv, cl, &pk) // alias.go
	h.encodeFeedback(cl, &pk)
	h.remaps.encode(cl, &pk)
	return pk
}

// encodeFeedback is OnPacketEncode's feedback and DISCONNECT part.
func (h *throttle) encodeFeedback(cl *mqtt.Client, pk *packets.Packet) {
	switch pk.FixedHeader.Type {
	case packets.Connack, packets.Puback, packets.Pubrec:
	case packets.Disconnect:
		silentDisconnect(cl, pk)
		return
	default:
		return
	}
	if cl.Properties.ProtocolVersion != 5 || pk.Origin == ackerOrigin {
		return
	}
	c := h.conns.info(cl)
	if c == nil || c.fb == nil {
		return
	}
	var props []packets.UserProperty
	if pk.FixedHeader.Type == packets.Connack {
		if pk.ReasonCode != 0 {
			return
		}
		f := c.fb
		if p := h.contract(c, f, h.clock.Now()); p != nil {
			f.policy = append(f.policy[:0], p...)
			f.props[0] = packets.UserProperty{Key: devicelimit.PolicyProperty, Val: view(f.policy)}
			props = f.props[:1]
		}
	} else if props = c.fb.takeFeedback(pk.PacketID); props == nil {
		return
	}
	if len(pk.Properties.User) > 0 {
		// A new slice: the ack may share the publish's properties.
		props = append(append(make([]packets.UserProperty, 0, len(pk.Properties.User)+len(props)), pk.Properties.User...), props...)
	}
	pk.Properties.User = props
	if pk.FixedHeader.Type == packets.Puback && pk.ReasonCode == packets.CodeGrantedQos1.Code {
		// mochi acks QoS 1 with its "granted QoS 1" code, 0x01, which
		// it writes only when the ack has properties: no PUBACK reason
		// code of MQTT 5 (3.4.2.1). Success is 0x00.
		pk.ReasonCode = packets.CodeSuccess.Code
	}
}

// silentDisconnect keeps the server's DISCONNECT from an MQTT 3.1.1 (or
// 3.1) client: those protocols have none (3.1.1 section 3.14: only the
// client sends one), and mochi writes one before it closes the
// connection on a session takeover, an ACL-refused QoS 1 or 2 publish
// and a shutdown. A packet of no type fails mochi's encode, so
// WritePacket writes nothing and mochi closes the connection as it
// would have (docs/mqtt-conformance.md).
func silentDisconnect(cl *mqtt.Client, pk *packets.Packet) {
	if cl.Properties.ProtocolVersion < 5 {
		pk.FixedHeader.Type = packets.Reserved
	}
}
