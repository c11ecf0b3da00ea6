package broker

// Refusals: what a device over its quota is told (MQTT 5 reason
// strings, PUBACK or PUBREC 0x97), what is logged, and the policy
// disconnect. The decision itself is in throttle.go.

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
)

// refusalReason returns the MQTT 5 reason string of a refusal under q
// with the given retry-after, formatting it only when it differs from
// the connection's last one (a flood repeats it for a millisecond).
func (c *connInfo) refusalReason(q devicelimit.Quota, d devicelimit.Decision, retry time.Duration) string {
	by := devicelimit.Decision{Limit: d.Limit, Unit: d.Unit}
	if c.reason == "" || c.reasonQuota != q || c.reasonRetry != retry || c.reasonBy != by {
		c.reason = refusalText("quota exceeded", q, "retry after "+retry.String()+refusedBy(q, d))
		c.reasonQuota, c.reasonRetry, c.reasonBy = q, retry, by
	}
	return c.reason
}

// refusedBy names, for a quota of several windows, the window that
// refused (the one that admits last): " (the 200 bytes per 1m0s window
// is full)"; "" for a quota of one.
func refusedBy(q devicelimit.Quota, d devicelimit.Decision) string {
	if q.NWindows < 2 {
		return ""
	}
	for _, l := range q.Windows[:min(q.NWindows, devicelimit.MaxWindows)] {
		if l.Unit == d.Unit && l.N == d.Limit {
			return fmt.Sprintf(" (the %d %s per %s window is full)", l.N, l.Unit, l.Window)
		}
	}
	return ""
}

// refusalText is the one builder of a publish refusal's MQTT 5 reason
// string: "quota exceeded: 10 messages per 1s, retry after 250ms".
func refusalText(what string, q devicelimit.Quota, detail string) string {
	return fmt.Sprintf("%s: %s, %s", what, q.Describe(), detail)
}

// refusing returns the quota whose window refused: the group's (gq)
// when byGroup, else the device's q.
func refusing(q, gq devicelimit.Quota, byGroup bool) devicelimit.Quota {
	if byGroup {
		return gq
	}
	return q
}

// refuse applies q's policy to a publish over quota and returns the error
// for mochi.
// The group's window refused it when byGroup (gq its quota).
func (h *throttle) refuse(cl *mqtt.Client, pk packets.Packet, c *connInfo, class string, q, gq devicelimit.Quota, byGroup bool, d devicelimit.Decision, now devicelimit.Tick) error {
	retry := ceilMillisecond(d.RetryAfter)
	h.logThrottled(cl, c, class, refusing(q, gq, byGroup), d, byGroup, now)
	reason := refusalWindow
	if byGroup {
		reason = refusalGroup
	}
	h.refused(c, pk.TopicName, class, reason, now)
	// A refusal by the group is the tenant's, not the device's doing:
	// it does not count towards the device's block.
	if q.Block.After > 0 && !byGroup && h.countRefusal(c, class, q, len(pk.Payload), now) {
		return h.blockNow(cl, c, q, class, now)
	}

	if q.Policy == devicelimit.PolicyDisconnect {
		what, rq := "message rate too high", q
		if byGroup {
			what, rq = "message rate of group "+c.rules().group.Name+" too high", gq
		}
		return h.disconnect(cl, c, packets.ErrMessageRateTooHigh.Code,
			refusalText(what, rq, "retry after "+retry.String()))
	}

	// PolicyDrop, and PolicyDefer without a store.
	h.dropped.Add(1)
	if !wantsRefusal(cl, pk) {
		return errIgnore // as quotaExceeded would, without the reason string
	}
	if byGroup {
		// Counted in Stats.Groups (decideGroup).
		if d.TooLarge {
			return h.quotaExceeded(cl, pk, refusalText("payload too large for the quota of group "+c.rules().group.Name, gq,
				fmt.Sprintf("%d bytes never fit a window of %d: not retried", len(pk.Payload), d.Limit)))
		}
		return h.quotaExceeded(cl, pk, refusalText("quota of group "+c.rules().group.Name+" exceeded", gq, "retry after "+retry.String()+refusedBy(gq, d)))
	}
	r := h.refusals[class]
	if r == nil {
		r = h.refusals[OverrideClass] // a class only an override names
	}
	if r != nil {
		k := int(d.Unit) // RefusedMessages, RefusedBytes
		if d.TooLarge {
			k = RefusedTooLarge
		}
		r[k].Add(1)
	}
	if d.TooLarge {
		return h.quotaExceeded(cl, pk, refusalText("payload too large for the quota"+ofClass(class), q,
			fmt.Sprintf("%d bytes never fit a window of %d: not retried", len(pk.Payload), d.Limit)))
	}
	if class != "" {
		return h.quotaExceeded(cl, pk, refusalText("quota exceeded"+ofClass(class), q, "retry after "+retry.String()+refusedBy(q, d)))
	}
	return h.quotaExceeded(cl, pk, c.refusalReason(q, d, retry))
}

// ofClass names a topic class in a refusal's reason string.
func ofClass(class string) string {
	if class == "" {
		return ""
	}
	return " (class " + class + ")"
}

// logThrottled logs a refusal by the window, at most once per window per
// device.
func (h *throttle) logThrottled(cl *mqtt.Client, c *connInfo, class string, q devicelimit.Quota, d devicelimit.Decision, byGroup bool, now devicelimit.Tick) {
	if now < c.quietUntil {
		return // the limiter would refuse: skip its lookup
	}
	device := c.device
	if ok, retry := h.logs.allowAt(logDevice, device, q.Shortest(), now); !ok {
		c.quietUntil = now.Add(retry)
		return
	}
	level, msg := slog.LevelInfo, "device throttled"
	if q.Policy == devicelimit.PolicyDisconnect && !byGroup {
		level = slog.LevelWarn
	}
	if q.Shadow {
		level, msg = slog.LevelInfo, "device would throttle (shadow mode: let through)"
	}
	if byGroup {
		h.log.Log(context.Background(), level, msg,
			"device", device, "client", cl.ID, "group", c.rules().group.Name, "group_quota", q.Describe(), "too_large", d.TooLarge,
			"retry_after", ceilMillisecond(d.RetryAfter).String())
		return
	}
	if q.NWindows > 0 || class != "" {
		h.log.Log(context.Background(), level, msg,
			"device", device, "client", cl.ID, "class", class, "quota", q.Describe(), "too_large", d.TooLarge,
			"policy", q.Policy.String(), "retry_after", ceilMillisecond(d.RetryAfter).String())
		return
	}
	h.log.Log(context.Background(), level, msg,
		"device", device, "client", cl.ID, "limit", q.Limit, "window", q.Window.String(),
		"policy", q.Policy.String(), "retry_after", ceilMillisecond(d.RetryAfter).String())
}

// quotaExceeded refuses a publish that is not forwarded and returns the
// error for mochi: MQTT 5 QoS 1/2 publishers get PUBACK/PUBREC 0x97 with
// reason; others an ordinary ack (3.1.1 cannot say no) or nothing (QoS 0).
func (h *throttle) quotaExceeded(cl *mqtt.Client, pk packets.Packet, reason string) error {
	if !wantsRefusal(cl, pk) {
		// QoS 0: nothing to ack. MQTT 3.1.1 QoS 1/2: mochi acks 0x00 and
		// forwards nothing; 3.1.1 has no way to say no.
		return errIgnore
	}
	ack := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Puback},
		PacketID:    pk.PacketID,
		ReasonCode:  packets.ErrQuotaExceeded.Code,
		Properties:  packets.Properties{ReasonString: reason},
	}
	if pk.FixedHeader.Qos == 2 {
		ack.FixedHeader.Type = packets.Pubrec // a QoS 2 flow ends with PUBREC >= 0x80, never PUBACK
	}
	// A write error means the connection is gone; mochi's read loop
	// notices. Either way nothing is forwarded, and ErrRejectPacket makes
	// processPublish return before it takes receive quota or stores the
	// packet in flight, so the client can go on publishing.
	_ = cl.WritePacket(ack)
	return errReject
}

// wantsRefusal reports whether a refused publish gets PUBACK/PUBREC 0x97:
// MQTT 5 with QoS 1 or 2.
func wantsRefusal(cl *mqtt.Client, pk packets.Packet) bool {
	return cl.Properties.ProtocolVersion == 5 && pk.FixedHeader.Qos > 0
}

// disconnectGrace is how long a device disconnected by policy has to
// read its DISCONNECT and close the connection itself.
const disconnectGrace = time.Second

// hangUp ends a connection after a DISCONNECT without losing it. A plain
// Close with the abusive device's next publishes still unread makes the
// kernel answer with a reset, and the client may then never see the
// DISCONNECT (seen with paho.golang in tests). So: half-close (FIN after
// the DISCONNECT), let the client close, and close for good after
// disconnectGrace if it does not. Until then its publishes are refused.
func hangUp(conn net.Conn) {
	hc, ok := conn.(interface{ CloseWrite() error })
	if !ok || hc.CloseWrite() != nil {
		_ = conn.Close()
		return
	}
	time.AfterFunc(disconnectGrace, func() { _ = conn.Close() })
}

// disconnect ends cl's connection for a refusal: MQTT 5 clients get a
// DISCONNECT with code and reason first; MQTT 3.1.1 has no server
// DISCONNECT: the connection just ends. Publishes read after it are
// refused uncounted (c.closing).
func (h *throttle) disconnect(cl *mqtt.Client, c *connInfo, code byte, reason string) error {
	c.closing.Store(true)
	h.disconnected.Add(1)
	if cl.Properties.ProtocolVersion == 5 {
		_ = cl.WritePacket(packets.Packet{
			FixedHeader: packets.FixedHeader{Type: packets.Disconnect},
			ReasonCode:  code,
			Properties:  packets.Properties{ReasonString: reason},
		})
	}
	hangUp(cl.Net.Conn)
	// The connection is closed (or closing), not the client: mochi's
	// read loop then fails like for any connection the server drops
	// and publishes the device's will (MQTT-3.1.2-8), so presence
	// tracking sees the device go offline. cl.Stop, as mochi's
	// DisconnectClient does, ends the loop quietly and drops the will.
	return errReject
}

// OverrideClass is the class Stats.Refusals counts the refusals of a
// topic class under when only a quota override names it: the metric's
// class label takes the configuration's class names, a bounded set, and
// this one.
const OverrideClass = "(override)"

// ceilMillisecond rounds d up to a whole millisecond, so a retry-after is
// never shorter than the real wait and never prints as 0s.
func ceilMillisecond(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return d
}
