package broker

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// Raw MQTT 5 packets, written by hand so that they can break the rules
// mochi does not enforce (issue 13, point 5).

func varInt(n int) []byte { return remLen(n) }

func prop(id byte, value ...byte) []byte { return append([]byte{id}, value...) }

func u16(v int) []byte { return []byte{byte(v >> 8), byte(v)} }

func u32(v int) []byte { return []byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)} }

func props(ps ...[]byte) []byte {
	body := bytes.Join(ps, nil)
	return append(varInt(len(body)), body...)
}

// Property identifiers (MQTT 5, 2.2.2.2).
const (
	propMessageExpiry  = 0x02
	propSessionExpiry  = 0x11
	propWillDelay      = 0x18
	propReceiveMaximum = 0x21
	propTopicAlias     = 0x23
	propUser           = 0x26
	propMaxPacketSize  = 0x27
)

var userProp = prop(propUser, append(mqttString("k"), mqttString("v")...)...)

// rawWill is a will for rawConnectV: its properties (MQTT 5 only), topic
// and payload.
type rawWill struct {
	props []byte
	topic string
}

// rawConnectV is a CONNECT of protocol level 4 or 5 with a clean start,
// keepalive 60 s, the given CONNECT properties (level 5) and will.
func rawConnectV(level byte, id string, ps []byte, w *rawWill) []byte {
	flags := byte(0x02)
	if w != nil {
		flags |= 0x04
	}
	body := append(mqttString("MQTT"), level, flags, 0, 60)
	if level == 5 {
		body = append(body, ps...)
	}
	body = append(body, mqttString(id)...)
	if w != nil {
		if level == 5 {
			body = append(body, w.props...)
		}
		body = append(append(body, mqttString(w.topic)...), mqttString("gone")...)
	}
	return packet(0x10, body)
}

// rawConnectFlags is a CONNECT of protocol name and level with the
// given connect flags, keepalive 60 s and client ID id, followed by the
// fields the flags announce (a will "dev/w", user name, password).
func rawConnectFlags(name string, level, flags byte, id string) []byte {
	body := append(mqttString(name), level, flags, 0, 60)
	if level == 5 {
		body = append(body, 0)
	}
	body = append(body, mqttString(id)...)
	if flags&0x04 != 0 {
		if level == 5 {
			body = append(body, 0)
		}
		body = append(append(body, mqttString("dev/w")...), mqttString("gone")...)
	}
	if flags&0x80 != 0 {
		body = append(body, mqttString("user")...)
	}
	if flags&0x40 != 0 {
		body = append(body, mqttString("secret")...)
	}
	return packet(0x10, body)
}

// rawPublish5 is an MQTT 5 PUBLISH at QoS 1 with packet ID pid.
func rawPublish5(topic string, pid int, ps []byte) []byte {
	body := append(append(mqttString(topic), u16(pid)...), ps...)
	return packet(0x32, append(body, "payload"...))
}

// rawSubscribe is a SUBSCRIBE of filter at QoS 1, MQTT 5 (with empty
// properties) or 3.1.1.
func rawSubscribe(level byte, pid int, filter string) []byte {
	body := u16(pid)
	if level == 5 {
		body = append(body, 0)
	}
	return packet(0x82, append(append(body, mqttString(filter)...), 1))
}

type rawPacket struct {
	typ  byte // the fixed header's first byte
	body []byte
}

// exchange writes data on a fresh connection to addr and returns the
// packets the server sent until it closed the connection, and whether
// it did close it within waitTimeout.
func exchange(t *testing.T, conn net.Conn, data ...[]byte) ([]rawPacket, bool) {
	t.Helper()
	defer conn.Close()
	for _, d := range data {
		if _, err := conn.Write(d); err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	_ = conn.SetReadDeadline(time.Now().Add(waitTimeout))
	got, err := io.ReadAll(conn)
	var ne net.Error
	closed := !(errors.As(err, &ne) && ne.Timeout())
	var pks []rawPacket
	for len(got) >= 2 {
		n, mul, i := 0, 1, 1
		for ; i < len(got) && i <= 4; i++ {
			n += int(got[i]&0x7f) * mul
			mul *= 128
			if got[i]&0x80 == 0 {
				break
			}
		}
		end := i + 1 + n
		if i >= len(got) || end > len(got) {
			t.Fatalf("truncated packet from the server: % x", got)
		}
		pks = append(pks, rawPacket{typ: got[0], body: got[i+1 : end]})
		got = got[end:]
	}
	return pks, closed
}

// reasonOf returns the reason code of a CONNACK, DISCONNECT or MQTT 5
// PUBACK, or of the first filter of a SUBACK.
func reasonOf(p rawPacket) byte {
	switch p.typ >> 4 {
	case 2: // CONNACK: flags, reason
		return p.body[1]
	case 4: // PUBACK: packet ID, reason (absent: success)
		if len(p.body) < 3 {
			return 0
		}
		return p.body[2]
	case 9: // SUBACK: packet ID, properties (MQTT 5), reasons
		return p.body[len(p.body)-1]
	case 14: // DISCONNECT
		return p.body[0]
	}
	return 0xff
}

func kinds(pks []rawPacket) []byte {
	var k []byte
	for _, p := range pks {
		k = append(k, p.typ>>4, reasonOf(p))
	}
	return k
}

// TestProtocolRulesEnforced sends what the MQTT specification forbids
// and mochi v2.7.9 accepted with success: each is refused as the
// specification says, a CONNECT with CONNACK 0x82 (MQTT 5) or a closed
// connection without CONNACK (3.1.1), a later packet with DISCONNECT
// 0x82, an empty share name with SUBACK 0x8F (3.1.1: 0x80). Each case
// runs on a connection of its own, over TCP and over WebSocket.
func TestProtocolRulesEnforced(t *testing.T) {
	f := start(t, fixtureOpts{options: func(o *Options) { o.WebSocketAddr = "127.0.0.1:0" }})
	conn5 := func(id string) []byte { return rawConnectV(5, id, props(), nil) }
	const (
		connack, puback, suback, disconnect = 2, 4, 9, 14
		protocolError, filterInvalid        = 0x82, 0x8f
		malformed                           = 0x81
	)
	cases := []struct {
		name string
		send [][]byte
		want []byte // packet type and reason code, in order
		// connectRefused: refused at CONNECT (counted as "protocol");
		// otherwise a DISCONNECT counts a protocol error when the
		// connection ends.
		connectRefused, disconnected bool
	}{
		{name: "will topic with a wildcard, MQTT 5",
			send: [][]byte{rawConnectV(5, "w5", props(), &rawWill{props: props(), topic: "dev/+/state"})},
			want: []byte{connack, protocolError}, connectRefused: true},
		{name: "will topic with a wildcard, MQTT 3.1.1",
			send:           [][]byte{rawConnectV(4, "w4", nil, &rawWill{topic: "dev/#"})},
			connectRefused: true},
		{name: "receive maximum 0",
			send: [][]byte{rawConnectV(5, "rm0", props(prop(propReceiveMaximum, u16(0)...)), nil)},
			want: []byte{connack, protocolError}, connectRefused: true},
		{name: "maximum packet size 0",
			send: [][]byte{rawConnectV(5, "mps0", props(prop(propMaxPacketSize, u32(0)...)), nil)},
			want: []byte{connack, protocolError}, connectRefused: true},
		{name: "session expiry interval twice",
			send: [][]byte{rawConnectV(5, "dup", props(prop(propSessionExpiry, u32(10)...), prop(propSessionExpiry, u32(20)...)), nil)},
			want: []byte{connack, protocolError}, connectRefused: true},
		{name: "will delay interval twice",
			send: [][]byte{rawConnectV(5, "dupwill", props(), &rawWill{topic: "dev/x",
				props: props(prop(propWillDelay, u32(1)...), prop(propWillDelay, u32(1)...))})},
			want: []byte{connack, protocolError}, connectRefused: true},
		{name: "message expiry interval twice in a publish, after a good one in the same write",
			send: [][]byte{conn5("duppub"), append(rawPublish5("dev/a", 1, props()),
				rawPublish5("dev/a", 2, props(prop(propMessageExpiry, u32(5)...), prop(propMessageExpiry, u32(6)...)))...)},
			want: []byte{connack, 0, puback, 0, disconnect, protocolError}, disconnected: true},
		{name: "empty topic with a topic alias never set",
			send: [][]byte{conn5("alias"), rawPublish5("", 1, props(prop(propTopicAlias, u16(1)...)))},
			want: []byte{connack, 0, disconnect, protocolError}, disconnected: true},
		{name: "empty share name, MQTT 5",
			send: [][]byte{conn5("share5"), rawSubscribe(5, 1, "$share//#")},
			want: []byte{connack, 0, suback, filterInvalid}},
		{name: "empty share name, MQTT 3.1.1",
			send: [][]byte{rawConnectV(4, "share4", nil, nil), rawSubscribe(4, 1, "$share//#")},
			want: []byte{connack, 0, suback, 0x80}},
		// CONNECT flags and protocol names: MQTT 3.1.1 gets no CONNACK
		// (3.1.1 has no return code for them), MQTT 5 0x81 or 0x84.
		{name: "reserved connect flag, MQTT 3.1.1",
			send: [][]byte{rawConnectFlags("MQTT", 4, 0x03, "res4")}, connectRefused: true},
		{name: "reserved connect flag, MQTT 5",
			send: [][]byte{rawConnectFlags("MQTT", 5, 0x03, "res5")}, want: []byte{connack, malformed}, connectRefused: true},
		{name: "will QoS 3, MQTT 3.1.1",
			send: [][]byte{rawConnectFlags("MQTT", 4, 0x1e, "wq3")}, connectRefused: true},
		{name: "will retain without a will, MQTT 3.1.1",
			send: [][]byte{rawConnectFlags("MQTT", 4, 0x22, "wr4")}, connectRefused: true},
		{name: "will QoS 1 without a will, MQTT 3.1.1",
			send: [][]byte{rawConnectFlags("MQTT", 4, 0x0a, "wq4")}, connectRefused: true},
		{name: "will QoS 1 without a will, MQTT 5",
			send: [][]byte{rawConnectFlags("MQTT", 5, 0x0a, "wq5")}, want: []byte{connack, malformed}, connectRefused: true},
		{name: "password without a user name, MQTT 3.1.1",
			send: [][]byte{rawConnectFlags("MQTT", 4, 0x42, "pw4")}, connectRefused: true},
		{name: "protocol name MQTX, MQTT 3.1.1",
			send: [][]byte{rawConnectFlags("MQTX", 4, 0x02, "name4")}, connectRefused: true},
		{name: "protocol name MQTX, MQTT 5",
			send: [][]byte{rawConnectFlags("MQTX", 5, 0x02, "name5")}, want: []byte{connack, 0x84}, connectRefused: true},
		{name: "protocol level 6",
			send: [][]byte{rawConnectFlags("MQTT", 6, 0x02, "level6")}, want: []byte{connack, 1}, connectRefused: true},
		{name: "empty client ID without clean session, MQTT 3.1.1",
			send: [][]byte{rawConnectFlags("MQTT", 4, 0x00, "")}, want: []byte{connack, 2}, connectRefused: true},
		// What the rules allow still passes.
		{name: "password without a user name, MQTT 5",
			send: [][]byte{rawConnectFlags("MQTT", 5, 0x42, "pw5")}, want: []byte{connack, 0}},
		{name: "user property twice, will without wildcard",
			send: [][]byte{rawConnectV(5, "ok", props(userProp, userProp), &rawWill{props: props(userProp, userProp), topic: "dev/ok"}),
				rawPublish5("dev/a", 1, props(userProp, userProp, prop(propTopicAlias, u16(3)...))),
				rawPublish5("", 2, props(prop(propTopicAlias, u16(3)...)))},
			want: []byte{connack, 0, puback, 0, puback, 0}},
	}
	for _, transport := range []string{"tcp", "ws"} {
		for _, c := range cases {
			t.Run(transport+"/"+c.name, func(t *testing.T) {
				before := f.srv.AuthStats()
				var conn net.Conn
				if transport == "tcp" {
					conn = dialTCP(t, f.addr)
				} else {
					conn = dialWS(t, f.srv.WebSocketAddr().String())
				}
				expectClose := c.connectRefused || c.disconnected
				if !expectClose {
					// Ends the exchange: the server answers PINGREQ,
					// then closes on DISCONNECT.
					c.send = append(c.send, []byte{0xc0, 0}, rawDisconnect)
					c.want = append(c.want, 13, 0xff)
				}
				pks, closed := exchange(t, conn, c.send...)
				if !closed {
					t.Fatalf("connection still open after %v; got %v", waitTimeout, kinds(pks))
				}
				if got := kinds(pks); !bytes.Equal(got, c.want) {
					t.Fatalf("server sent (type, reason) % x; want % x", got, c.want)
				}
				after := f.srv.AuthStats()
				wantRefused := before.ConnectsRefused["protocol"]
				wantErrors := before.ProtocolErrors
				if c.connectRefused {
					wantRefused++
				}
				if c.disconnected {
					wantErrors++
				}
				if after.ConnectsRefused["protocol"] != wantRefused || after.ProtocolErrors != wantErrors {
					t.Fatalf("refused as protocol %d (want %d), protocol errors %d (want %d)",
						after.ConnectsRefused["protocol"], wantRefused, after.ProtocolErrors, wantErrors)
				}
			})
		}
	}
}
