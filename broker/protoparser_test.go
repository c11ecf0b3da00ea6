package broker

import (
	"bytes"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/eclipse/paho.golang/packets"
)

// encode writes packets with paho.golang's encoder, a client's.
func encode(t testing.TB, pks ...io.WriterTo) []byte {
	t.Helper()
	var b bytes.Buffer
	for _, p := range pks {
		if _, err := p.WriteTo(&b); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

func ptr[T any](v T) *T { return &v }

// everyProperty is a client's property set with every kind of value: a
// byte, 2 and 4 byte integers, strings, binary data and user properties
// (which may repeat).
func everyProperty() *packets.Properties {
	return &packets.Properties{
		PayloadFormat: ptr[byte](1), MessageExpiry: ptr[uint32](60), ContentType: "text/plain",
		ResponseTopic: "dev/r", CorrelationData: bytes.Repeat([]byte{0x80}, 300), TopicAlias: ptr[uint16](2),
		User: []packets.User{{Key: "a", Value: strings.Repeat("v", 200)}, {Key: "a", Value: "w"}},
	}
}

// goodStream is an MQTT 5 session as paho.golang encodes it: nothing in
// it breaks the rules protoConn checks.
func goodStream(t testing.TB) []byte {
	return encode(t,
		&packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: "dev-1", CleanStart: true, KeepAlive: 30,
			UsernameFlag: true, Username: "u", PasswordFlag: true, Password: []byte("p"),
			Properties: &packets.Properties{SessionExpiryInterval: ptr[uint32](60), ReceiveMaximum: ptr[uint16](10),
				MaximumPacketSize: ptr[uint32](1 << 20), TopicAliasMaximum: ptr[uint16](5), RequestProblemInfo: ptr[byte](1),
				User: []packets.User{{Key: "k", Value: "v"}, {Key: "k", Value: "v"}}},
			WillFlag: true, WillTopic: "dev/1/state", WillMessage: []byte("gone"),
			WillProperties: &packets.Properties{WillDelayInterval: ptr[uint32](5), ContentType: "text/plain"}},
		&packets.Publish{Topic: "dev/1/t", QoS: 1, PacketID: 1, Properties: everyProperty(), Payload: bytes.Repeat([]byte("x#+"), 1000)},
		&packets.Publish{Topic: "", QoS: 0, Properties: &packets.Properties{TopicAlias: ptr[uint16](2)}, Payload: []byte("y")},
		&packets.Publish{Topic: "dev/1/u", QoS: 2, PacketID: 2, Properties: &packets.Properties{}},
		&packets.Pubrel{PacketID: 2, ReasonCode: 0, Properties: &packets.Properties{ReasonString: "ok", User: []packets.User{{Key: "a", Value: "b"}}}},
		&packets.Puback{PacketID: 7, ReasonCode: 0x10, Properties: &packets.Properties{ReasonString: "none"}},
		&packets.Puback{PacketID: 8},
		&packets.Subscribe{PacketID: 3, Properties: &packets.Properties{SubscriptionIdentifier: ptr(4000),
			User: []packets.User{{Key: "a", Value: "b"}}}, Subscriptions: []packets.SubOptions{{Topic: "dev/#", QoS: 1}, {Topic: "x/+", QoS: 0}}},
		&packets.Unsubscribe{PacketID: 4, Properties: &packets.Properties{}, Topics: []string{"x/+"}},
		&packets.Pingreq{},
		&packets.Auth{ReasonCode: 0x19, Properties: &packets.Properties{AuthMethod: "m", AuthData: []byte{1, 2}}},
		&packets.Disconnect{ReasonCode: 0x04, Properties: &packets.Properties{SessionExpiryInterval: ptr[uint32](0), ReasonString: "bye"}},
	)
}

// feedSplit feeds stream to a fresh parser in reads of the given sizes
// (cycled), as a connection delivers it, and returns the bytes passed on
// and the violation found.
func feedSplit(stream []byte, sizes []int) (*protoParser, int, *protocolViolation) {
	p := &protoParser{}
	delivered := 0
	for i := 0; len(stream) > 0; i++ {
		n := min(sizes[i%len(sizes)], len(stream))
		at, v := p.feed(stream[:n])
		if v != nil {
			return p, delivered + at, v
		}
		delivered += n
		stream = stream[n:]
	}
	return p, delivered, nil
}

// splits are the read patterns every stream is fed in: whole, a byte
// at a time, and random sizes.
func splits(r *rand.Rand, n int) [][]int {
	out := [][]int{{n}, {1}, {2}, {3}, {7}}
	for range 20 {
		var s []int
		for range 16 {
			s = append(s, 1+r.IntN(64))
		}
		out = append(out, s)
	}
	return out
}

func TestProtoParserPassesGoodStream(t *testing.T) {
	stream := goodStream(t)
	r := rand.New(rand.NewPCG(1, 2))
	for _, sizes := range splits(r, len(stream)) {
		p, delivered, v := feedSplit(stream, sizes)
		if v != nil {
			t.Fatalf("reads of %v: violation %q in a stream that has none", sizes, v.reason)
		}
		if delivered != len(stream) || p.off || p.state != stType || p.skip != 0 {
			t.Fatalf("reads of %v: delivered %d of %d, off %v, state %d, skip %d: lost the packet boundaries",
				sizes, delivered, len(stream), p.off, p.state, p.skip)
		}
		if p.version != 5 || p.clientMax != 1<<20 {
			t.Fatalf("reads of %v: version %d, client maximum packet size %d", sizes, p.version, p.clientMax)
		}
	}
}

func TestProtoParserFindsViolations(t *testing.T) {
	good := goodStream(t)
	good = good[:len(good)-len(encode(t, &packets.Disconnect{ReasonCode: 0x04,
		Properties: &packets.Properties{SessionExpiryInterval: ptr[uint32](0), ReasonString: "bye"}}))]
	connect := encode(t, &packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: "c", CleanStart: true})
	cases := []struct {
		name, reason string
		prefix, bad  []byte
		atConnect    bool
	}{
		{"will wildcard 5", "will topic contains a wildcard", nil,
			rawConnectV(5, "w", props(), &rawWill{props: props(userProp), topic: "a/#"}), true},
		{"will wildcard 3.1.1", "will topic contains a wildcard", nil,
			rawConnectV(4, "w", nil, &rawWill{topic: "+"}), true},
		{"receive maximum 0", "Receive Maximum is 0", nil,
			rawConnectV(5, "r", props(userProp, prop(propReceiveMaximum, u16(0)...)), nil), true},
		{"maximum packet size 0", "Maximum Packet Size is 0", nil,
			rawConnectV(5, "m", props(prop(propMaxPacketSize, u32(0)...)), nil), true},
		{"duplicate in connect", "duplicate property Session Expiry Interval", nil,
			rawConnectV(5, "d", props(prop(propSessionExpiry, u32(1)...), userProp, prop(propSessionExpiry, u32(1)...)), nil), true},
		{"duplicate in will", "duplicate property Will Delay Interval", nil,
			rawConnectV(5, "d", props(), &rawWill{topic: "t", props: props(prop(propWillDelay, u32(1)...), prop(propWillDelay, u32(2)...))}), true},
		{"duplicate in publish", "duplicate property Message Expiry Interval", good,
			rawPublish5("dev/a", 9, props(prop(propMessageExpiry, u32(5)...), userProp, prop(propMessageExpiry, u32(6)...))), false},
		{"duplicate in QoS 2 publish", "duplicate property Payload Format Indicator", connect,
			packet(0x34, append(append(append(mqttString("t"), 0, 5), props(prop(0x01, 1), prop(0x01, 1))...), 'x')), false},
		{"duplicate in QoS 0 publish", "duplicate property Topic Alias", connect,
			packet(0x30, append(append(mqttString("t"), props(prop(propTopicAlias, u16(1)...), prop(propTopicAlias, u16(1)...))...), 'x')), false},
		{"duplicate string in publish", "duplicate property Content Type", connect,
			rawPublish5("dev/a", 9, props(prop(0x03, mqttString("a")...), prop(0x03, mqttString("b")...))), false},
		{"duplicate in puback", "duplicate property Reason String", connect,
			packet(0x40, append([]byte{0, 1, 0x10}, props(prop(0x1f, mqttString("a")...), prop(0x1f, mqttString("b")...))...)), false},
		{"duplicate in subscribe", "duplicate property Subscription Identifier Available", connect,
			packet(0x82, append(append([]byte{0, 1}, props(prop(0x29, 1), prop(0x29, 1))...), append(mqttString("a"), 0)...)), false},
		{"duplicate in disconnect", "duplicate property Session Expiry Interval", good,
			packet(0xe0, append([]byte{0}, props(prop(propSessionExpiry, u32(0)...), prop(propSessionExpiry, u32(0)...))...)), false},
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stream := append(append([]byte{}, c.prefix...), c.bad...)
			stream = append(stream, encode(t, &packets.Pingreq{})...) // never reached
			for _, sizes := range splits(r, len(stream)) {
				_, delivered, v := feedSplit(stream, sizes)
				if v == nil {
					t.Fatalf("reads of %v: no violation", sizes)
				}
				if v.reason != c.reason || v.atConnect != c.atConnect {
					t.Fatalf("reads of %v: violation %q (at CONNECT %v), want %q (%v)", sizes, v.reason, v.atConnect, c.reason, c.atConnect)
				}
				// Whole packets before the offending one are passed
				// on; of the offending one, only what came in earlier
				// reads.
				if delivered < len(c.prefix) || delivered >= len(c.prefix)+len(c.bad) && len(c.bad) > 0 {
					t.Fatalf("reads of %v: passed on %d bytes; the offending packet spans %d..%d", sizes, delivered, len(c.prefix), len(c.prefix)+len(c.bad))
				}
				if sizes[0] >= len(stream) && delivered != len(c.prefix) {
					t.Fatalf("one read: passed on %d bytes, want the %d before the offending packet", delivered, len(c.prefix))
				}
			}
		})
	}
}

// TestProtoParserStopsOnMQTT311 checks that an MQTT 3.1.1 connection is
// followed only through CONNECT: what comes after costs nothing.
func TestProtoParserStopsOnMQTT311(t *testing.T) {
	p := &protoParser{}
	if _, v := p.feed(rawConnectV(4, "c", nil, &rawWill{topic: "a/b"})); v != nil || !p.off || p.version != 4 {
		t.Fatalf("violation %v, off %v, version %d; want none, true, 4", v, p.off, p.version)
	}
}

// TestRefusalPacket checks the CONNACK and DISCONNECT a violation gets,
// decoded by paho.golang, and that the reason string is left out when
// the client's Maximum Packet Size would not take it.
func TestRefusalPacket(t *testing.T) {
	for _, atConnect := range []bool{true, false} {
		for _, max := range []uint32{0, 20} {
			b := refusalPacket(atConnect, 0x82, "duplicate property Topic Alias", max)
			cp, err := packets.ReadPacket(bytes.NewReader(b))
			if err != nil {
				t.Fatalf("at CONNECT %v, max %d: % x does not decode: %v", atConnect, max, b, err)
			}
			var code byte
			var reason string
			switch pk := cp.Content.(type) {
			case *packets.Connack:
				code, reason = pk.ReasonCode, pk.Properties.ReasonString
			case *packets.Disconnect:
				code, reason = pk.ReasonCode, pk.Properties.ReasonString
			}
			if isConnack := cp.Type == packets.CONNACK; isConnack != atConnect || code != 0x82 {
				t.Fatalf("at CONNECT %v: packet type %d, reason code %#x", atConnect, cp.Type, code)
			}
			if wantString := max == 0; (reason != "") != wantString || max > 0 && uint32(len(b)) > max {
				t.Fatalf("max %d: %d bytes, reason string %q", max, len(b), reason)
			}
		}
	}
}

// FuzzProtoParser feeds what a hostile client could send: the parser
// must not panic (it runs on mochi's read goroutine), and must find the
// same thing however the bytes are split into reads. `go test
// -fuzz=FuzzProtoParser ./broker` explores beyond the seeds.
func FuzzProtoParser(f *testing.F) {
	f.Add(goodStream(f), uint8(7))
	f.Add(rawConnectV(5, "d", props(prop(propSessionExpiry, u32(1)...), prop(propSessionExpiry, u32(1)...)), nil), uint8(1))
	f.Add(append(rawConnectV(5, "c", props(), nil), rawPublish5("t", 1, props(userProp, prop(0x02, u32(1)...)))...), uint8(3))
	f.Add(rawConnectV(4, "w", nil, &rawWill{topic: "#"}), uint8(2))
	f.Fuzz(func(t *testing.T, stream []byte, size uint8) {
		whole := &protoParser{}
		at, v := whole.feed(stream)
		_, delivered, vs := feedSplit(stream, []int{1 + int(size)})
		if (v == nil) != (vs == nil) || v != nil && v.reason != vs.reason {
			t.Fatalf("one read: %v; reads of %d: %v", v, 1+int(size), vs)
		}
		// The offending packet starts at at; reads pass on no more
		// than the part of it that came before the read that showed it.
		if v != nil && (delivered < at || delivered >= packetEnd(stream, at)) {
			t.Fatalf("offending packet at %d..%d, reads of %d passed on %d bytes", at, packetEnd(stream, at), 1+int(size), delivered)
		}
	})
}

// packetEnd returns the offset just past the packet starting at start.
func packetEnd(b []byte, start int) int {
	n, mul, i := 0, 1, start+1
	for ; i < len(b); i++ {
		n += int(b[i]&0x7f) * mul
		mul *= 128
		if b[i]&0x80 == 0 {
			break
		}
	}
	return i + 1 + n
}
