package broker

import (
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
)

// The gateway's cost per message over plain mochi's, hook by hook, on
// clients with a connection as the listeners give them (a protoConn;
// its writes go nowhere). Instruction counts of these under callgrind
// are what docs/benchmarks.md ("The gateway's hooks per message")
// gives; they do not depend on the machine's load.
//
//	go test -run '^$' -bench 'ConnOnPublish|WritePacket' -benchmem ./broker/

// discardConn is a connection whose writes go nowhere.
type discardConn struct{ net.Conn }

func (discardConn) Write(b []byte) (int, error) { return len(b), nil }
func (discardConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1883}
}

// newConnClient is newHookClient's server with a client connected
// through a protoConn, as the gateway's listeners connect them.
func newConnClient(t testing.TB, q devicelimit.Quota, version byte) (*Server, *mqtt.Client, packets.Packet) {
	s, _, pk := newHookClient(t, q)
	cl := s.mqtt.NewClient(&protoConn{Conn: discardConn{}}, "tcp", "dev-2", false)
	cl.Properties.ProtocolVersion = version
	s.hook.OnSessionEstablish(cl, packets.Packet{})
	pk.TopicName = "t/dev-2"
	return s, cl, pk
}

// BenchmarkConnOnPublish is the throttle's OnPublish for a connected
// client: admitted (QoS 1, MQTT 5, feedback off) and refused (QoS 0,
// MQTT 3.1.1).
func BenchmarkConnOnPublish(b *testing.B) {
	for _, c := range []struct {
		name    string
		limit   int
		version byte
		qos     byte
	}{{"allowed", devicelimit.MaxLimit, 5, 1}, {"refused-v3-qos0", 1, 4, 0}} {
		b.Run(c.name, func(b *testing.B) {
			s, cl, pk := newConnClient(b, devicelimit.Quota{Limit: c.limit, Window: time.Second, Feedback: quiet}, c.version)
			pk.FixedHeader.Qos = c.qos
			b.ReportAllocs()
			for b.Loop() {
				_, _ = s.hook.OnPublish(cl, pk)
			}
		})
	}
}

// BenchmarkWritePacket is mochi's write of a delivered publish (MQTT
// 3.1.1, QoS 0) and of a PUBACK (MQTT 5), with the gateway's hooks and
// with plain mochi's (bench/plainmochi: allow-all authentication only):
// what OnPacketEncode and OnPacketSent add to every packet written.
func BenchmarkWritePacket(b *testing.B) {
	plain := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := plain.AddHook(new(auth.AllowHook), nil); err != nil {
		b.Fatal(err)
	}
	pub := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish},
		TopicName:   "t/dev-2",
		Payload:     make([]byte, 64),
	}
	ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: 7}
	for _, srv := range []string{"gateway", "mochi"} {
		for _, c := range []struct {
			name    string
			version byte
			pk      packets.Packet
		}{{"v3-publish", 4, pub}, {"v5-puback", 5, ack}} {
			b.Run(srv+"/"+c.name, func(b *testing.B) {
				var cl *mqtt.Client
				if srv == "gateway" {
					_, cl, _ = newConnClient(b, devicelimit.Quota{Limit: devicelimit.MaxLimit, Window: time.Second}, c.version)
				} else {
					cl = plain.NewClient(discardConn{}, "tcp", "dev-2", false)
					cl.Properties.ProtocolVersion = c.version
				}
				b.ReportAllocs()
				for b.Loop() {
					if err := cl.WritePacket(c.pk); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
