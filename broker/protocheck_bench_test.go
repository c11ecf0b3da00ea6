package broker

import (
	"bytes"
	"testing"

	"github.com/eclipse/paho.golang/packets"
	mpackets "github.com/mochi-mqtt/server/v2/packets"
)

// benchPublish is a device's MQTT 5 QoS 1 publish: a 20-byte topic, a
// message expiry, a user property and a 100-byte payload.
func benchPublish(b *testing.B) []byte {
	return encode(b, &packets.Publish{Topic: "devices/dev-000123/t", QoS: 1, PacketID: 1,
		Properties: &packets.Properties{MessageExpiry: ptr[uint32](60), User: []packets.User{{Key: "fw", Value: "1.2.3"}}},
		Payload:    bytes.Repeat([]byte{'x'}, 100)})
}

// BenchmarkProtoCheckPublish is what protoConn adds to every MQTT 5
// publish read; BenchmarkMochiDecodePublish, mochi's decoding of the same
// packet, is the baseline it compares with.
func BenchmarkProtoCheckPublish(b *testing.B) {
	pk := benchPublish(b)
	stream := bytes.Repeat(pk, 64)
	p := &protoParser{version: 5}
	b.SetBytes(int64(len(pk)))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%64 == 0 {
			if _, v := p.feed(stream); v != nil {
				b.Fatal(v)
			}
		}
	}
}

func BenchmarkMochiDecodePublish(b *testing.B) {
	raw := benchPublish(b)
	i := 1 // the body follows the type and the remaining length
	for raw[i]&0x80 != 0 {
		i++
	}
	body := raw[i+1:]
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		pk := mpackets.Packet{ProtocolVersion: 5, FixedHeader: mpackets.FixedHeader{Type: mpackets.Publish, Qos: 1, Remaining: len(body)}}
		if err := pk.PublishDecode(body); err != nil {
			b.Fatal(err)
		}
	}
}
