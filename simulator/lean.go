package simulator

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	mpackets "github.com/mochi-mqtt/server/v2/packets"
)

// clientLean is an MQTT 5 device for runs at scale (Config.Client
// "lean"): the device's own goroutine writes each PUBLISH and reads its
// ack, with no goroutine of the client's, a 256-byte read buffer and
// mochi's packet codec (github.com/mochi-mqtt/server/v2/packets, which
// the gateway is built on). It connects with keepalive 0, so an idle
// device sends nothing between messages; when the broker imposes a
// keepalive (MQTT 5 Server Keep Alive: the gateway's mqtt.keepalive.max,
// Mosquitto's max_keepalive), the device's loop sends a PINGREQ when
// half of it has passed without a packet (pinger). What paho.golang gives the protocol-feature runs (a pinger,
// session state, a reader goroutine, queues) it leaves out.
type clientLean struct {
	conn net.Conn
	r    *bufio.Reader
	qos  byte
	id   uint16 // the last packet ID used
	buf  bytes.Buffer
	// keepalive is the broker's Server Keep Alive, 0 for none; last is
	// when the client last sent a packet.
	keepalive time.Duration
	last      time.Time
	// out and in are the packet being sent and the one read, kept here
	// rather than on the goroutine's stack: a packets.Packet is 800
	// bytes, and the device's goroutine should stay small while idle.
	out, in mpackets.Packet
	// feedback, when not nil, holds what the gateway told the device
	// about its quota.
	feedback *leanFeedback
}

// leanFeedback is the gateway's feedback as a lean client last read it.
type leanFeedback struct {
	// policy is the last RateLimit-Policy (CONNACK's, or a later
	// acknowledgement's after the quota changed); policyChanged is set
	// when it was read, for the device to clear.
	policy        string
	policyChanged bool
	// rateLimit is the last acknowledgement's RateLimit, "" for none.
	rateLimit string
}

// take records the feedback of the acknowledgement in pk.
func (f *leanFeedback) take(pk *mpackets.Packet) {
	if f == nil {
		return
	}
	f.rateLimit = userProperty(pk, PropRateLimit)
	if p := userProperty(pk, PropRateLimitPolicy); p != "" {
		f.policy, f.policyChanged = p, true
	}
}

// userProperty returns the value of pk's user property key, "" for none.
func userProperty(pk *mpackets.Packet, key string) string {
	for _, u := range pk.Properties.User {
		if u.Key == key {
			return u.Val
		}
	}
	return ""
}

// leanReadBuffer is the read buffer of a lean client: acks are a few
// bytes.
const leanReadBuffer = 256

// dialLean connects a lean client; with feedback, it keeps the
// gateway's RateLimit-Policy and each acknowledgement's RateLimit
// (clientLean.feedback).
func dialLean(ctx context.Context, addr, id string, qos byte, auth Auth, w *wireCount, feedback bool) (*clientLean, error) {
	conn, err := auth.dialConn(ctx, addr, w)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	c := &clientLean{conn: conn, r: bufio.NewReaderSize(conn, leanReadBuffer), qos: qos}
	if feedback {
		c.feedback = new(leanFeedback)
	}
	pk := &c.out
	pk.FixedHeader.Type = mpackets.Connect
	pk.ProtocolVersion = 5
	pk.Connect.ProtocolName = []byte("MQTT")
	pk.Connect.Clean = true
	pk.Connect.ClientIdentifier = id
	pk.Properties.ReceiveMaximum = deviceReceiveMaximum
	if auth.Username != "" {
		pk.Connect.UsernameFlag, pk.Connect.Username = true, []byte(auth.Username)
		pk.Connect.PasswordFlag, pk.Connect.Password = true, []byte(auth.Password)
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := c.roundTrip(pk.ConnectEncode, mpackets.Connack, 0); err != nil {
		conn.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	ca := &c.in
	if ca.ReasonCode >= 0x80 {
		conn.Close()
		return nil, refusedLean(ca)
	}
	if c.feedback != nil {
		c.feedback.policy, c.feedback.policyChanged = userProperty(ca, PropRateLimitPolicy), true
	}
	if ca.Properties.ServerKeepAliveFlag {
		c.keepalive = time.Duration(ca.Properties.ServerKeepAlive) * time.Second
	}
	_ = conn.SetDeadline(time.Time{})
	c.out, c.in = mpackets.Packet{}, mpackets.Packet{} // the credentials and the CONNACK's properties
	return c, nil
}

// refusedLean is refused5 for a CONNACK read by the lean client.
func refusedLean(ca *mpackets.Packet) error {
	if ca.ReasonCode == 0x8A { // banned: automatic blocking
		return fmt.Errorf("%w: CONNACK 0x8A banned", ErrBlocked)
	}
	reason := ""
	name, known := connackNames[ca.ReasonCode]
	if rs := ca.Properties.ReasonString; rs != "" && rs != name {
		reason = ": " + rs
	}
	if known {
		return fmt.Errorf("%w: CONNACK 0x%02x %s%s", ErrConnectRefused, ca.ReasonCode, name, reason)
	}
	return fmt.Errorf("connect: CONNACK 0x%02x%s", ca.ReasonCode, reason)
}

// roundTrip writes c.out with encode (one of its methods) and reads
// packets into c.in until one of type want (see read).
func (c *clientLean) roundTrip(encode func(*bytes.Buffer) error, want byte, id uint16) error {
	c.buf.Reset()
	if err := encode(&c.buf); err != nil {
		return err
	}
	if _, err := c.conn.Write(c.buf.Bytes()); err != nil {
		return err
	}
	c.last = time.Now()
	return c.read(want, id)
}

// pingDue returns when the client must send a PINGREQ to stay within
// the broker's keepalive (half of it after its last packet), if it must.
func (c *clientLean) pingDue() (time.Time, bool) {
	if c.keepalive <= 0 {
		return time.Time{}, false
	}
	return c.last.Add(c.keepalive / 2), true
}

// ping sends a PINGREQ and reads the PINGRESP.
func (c *clientLean) ping() error {
	_ = c.conn.SetDeadline(time.Now().Add(ackTimeout))
	defer c.conn.SetDeadline(time.Time{})
	if _, err := c.conn.Write([]byte{mpackets.Pingreq << 4, 0}); err != nil {
		return err
	}
	c.last = time.Now()
	return c.read(mpackets.Pingresp, 0)
}

// read reads packets into c.in until one of type want (with packet ID
// id, for acks). A DISCONNECT from the gateway ends the connection:
// with 0x98 (administrative action) it is automatic blocking,
// ErrBlocked.
func (c *clientLean) read(want byte, id uint16) error {
	pk := &c.in
	for {
		hb, err := c.r.ReadByte()
		if err != nil {
			return err
		}
		*pk = mpackets.Packet{ProtocolVersion: 5}
		if err := pk.FixedHeader.Decode(hb); err != nil {
			return err
		}
		n, _, err := mpackets.DecodeLength(c.r)
		if err != nil {
			return err
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(c.r, body); err != nil {
			return err
		}
		pk.FixedHeader.Remaining = n
		switch pk.FixedHeader.Type {
		case mpackets.Disconnect:
			if err := pk.DisconnectDecode(body); err != nil {
				return err
			}
			c.conn.Close()
			if pk.ReasonCode == 0x98 {
				return fmt.Errorf("%w: DISCONNECT 0x98", ErrBlocked)
			}
			return fmt.Errorf("disconnected by the gateway: DISCONNECT 0x%02x %s", pk.ReasonCode, pk.Properties.ReasonString)
		case want:
		default:
			continue // nothing else is expected; a device subscribes to nothing
		}
		switch want {
		case mpackets.Connack:
			err = pk.ConnackDecode(body)
		case mpackets.Puback:
			err = pk.PubackDecode(body)
		case mpackets.Pubrec:
			err = pk.PubrecDecode(body)
		case mpackets.Pubcomp:
			err = pk.PubcompDecode(body)
		}
		if err != nil {
			return err
		}
		if want == mpackets.Connack || want == mpackets.Pingresp || pk.PacketID == id {
			return nil
		}
	}
}

func (c *clientLean) publish(_ context.Context, topic string, payload []byte) (Ack, byte, error) {
	pk := &c.out
	*pk = mpackets.Packet{}
	pk.FixedHeader.Type, pk.FixedHeader.Qos = mpackets.Publish, c.qos
	pk.ProtocolVersion = 5
	pk.TopicName, pk.Payload = topic, payload
	defer func() { pk.Payload = nil }() // the caller's buffer
	if c.qos == 0 {
		c.buf.Reset()
		if err := pk.PublishEncode(&c.buf); err != nil {
			return AckNone, 0, err
		}
		_, err := c.conn.Write(c.buf.Bytes())
		c.last = time.Now()
		return AckNone, 0, err
	}
	c.id++
	if c.id == 0 {
		c.id = 1
	}
	pk.PacketID = c.id
	_ = c.conn.SetDeadline(time.Now().Add(ackTimeout))
	defer c.conn.SetDeadline(time.Time{})
	want := mpackets.Puback
	if c.qos == 2 {
		want = mpackets.Pubrec
	}
	if err := c.roundTrip(pk.PublishEncode, want, c.id); err != nil {
		return AckNone, 0, err
	}
	c.feedback.take(&c.in)
	if code := c.in.ReasonCode; code >= 0x80 {
		return AckRefused, code, nil
	}
	code := c.in.ReasonCode
	if c.qos == 2 {
		*pk = mpackets.Packet{}
		pk.FixedHeader.Type, pk.FixedHeader.Qos = mpackets.Pubrel, 1
		pk.ProtocolVersion, pk.PacketID = 5, c.id
		if err := c.roundTrip(pk.PubrelEncode, mpackets.Pubcomp, c.id); err != nil {
			return AckNone, 0, err
		}
	}
	return AckSuccess, code, nil
}

func (c *clientLean) close() {
	pk := &c.out
	*pk = mpackets.Packet{}
	pk.FixedHeader.Type, pk.ProtocolVersion = mpackets.Disconnect, 5
	c.buf.Reset()
	if pk.DisconnectEncode(&c.buf) == nil {
		_ = c.conn.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.conn.Write(c.buf.Bytes())
	}
	c.conn.Close()
}

// errLeanProtocol is Config validation's: the lean client speaks MQTT 5.
var errLeanProtocol = errors.New("the lean client speaks MQTT 5 only")
