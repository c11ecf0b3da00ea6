package broker

import (
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
)

// A released deferred message is forwarded with its release stamp,
// whatever its device's protocol: an MQTT 3.1.1 device's message has no
// properties of its own, but the stamp is the gateway's (before, only an
// MQTT 5 device's message kept it).
func TestForwardMessageKeepsReleaseStamp(t *testing.T) {
	for _, version := range []byte{4, 5} {
		m := deferredMsg{Version: version, Topic: "t/dev-1", Payload: []byte("x"), QoS: 1, Released: devicelimit.Tick(1_700_000_000_000_000_000)}
		pk := m.packet(0)
		pk.ProtocolVersion = version // as InjectPacket sets it from the releasing client (broker.go, publishDeferred)
		fm := forwardMessage("dev-1", &pk)
		if fm.Props == nil || len(fm.Props.User) != 1 || fm.Props.User[0].Key != devicelimit.ReleasedProperty || fm.Props.User[0].Value == "" {
			t.Fatalf("MQTT version %d: forwarded properties %+v, want the release stamp %q", version, fm.Props, devicelimit.ReleasedProperty)
		}
	}
	// A message that was not deferred has none.
	pk := packets.Packet{ProtocolVersion: 4, TopicName: "t/dev-1", Payload: []byte("x")}
	if fm := forwardMessage("dev-1", &pk); fm.Props != nil {
		t.Fatalf("forwarded properties %+v for a plain MQTT 3.1.1 publish, want none", fm.Props)
	}
}
