package broker

import (
	"testing"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"
)

// TestTopicAliasUnderACL: an MQTT 5 device may set a topic alias on a
// topic of its own and then publish with the alias alone; the ACL judges
// the topic the alias stands for. Re-pointing the alias at another
// device's topic is refused and leaves the alias where it was.
func TestTopicAliasUnderACL(t *testing.T) {
	creds := credentials(t)
	f := start(t, fixtureOpts{options: func(o *Options) { o.Auth = Auth{Credentials: creds, ACL: defaultACL(t)} }})
	got := consume(t, f, "devices/#")
	dev := mustConnect5(t, dialTCP(t, f.addr), login{"dev-1", "dev-1", "dev-1-pw"}, nil)
	pub := func(topic, payload string) byte {
		t.Helper()
		alias := uint16(1)
		ctx, cancel := contextTimeout()
		defer cancel()
		resp, err := dev.c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload),
			Properties: &paho.PublishProperties{TopicAlias: &alias}})
		if resp == nil {
			t.Fatalf("publish %q: %v", topic, err)
		}
		return resp.ReasonCode
	}
	for _, step := range []struct {
		topic, payload string
		want           byte
	}{
		{"devices/dev-1/temp", "set", 0},
		{"", "alias only", 0},
		{"devices/dev-2/temp", "forged", packets.ErrNotAuthorized.Code},
		{"", "alias again", 0},
	} {
		if code := pub(step.topic, step.payload); code != step.want {
			t.Fatalf("publish %q with alias 1: 0x%02x, want 0x%02x", step.topic, code, step.want)
		}
	}
	// The marker through the same connection: mochi writes a QoS 1
	// publish's PUBACK before it hands the message to its subscribers,
	// so another client's marker, sent once the last PUBACK came, could
	// overtake the last message (seen under load: 10 runs in 300).
	if code := pub("devices/dev-1/marker", "end"); code != 0 {
		t.Fatalf("marker: 0x%02x", code)
	}
	want := []string{"devices/dev-1/temp set", "devices/dev-1/temp alias only", "devices/dev-1/temp alias again"}
	if msgs := got.waitMarker(t, "devices/dev-1/marker end"); !equal(msgs, want) {
		t.Fatalf("consumer got %q, want %q", msgs, want)
	}
}

// consume connects the consumer account "backend" subscribed to filter
// and returns what it receives, as "topic payload".
func consume(t *testing.T, f *fixture, filter string) *sink {
	t.Helper()
	got := new(sink)
	cons := mustConnect5(t, dialTCP(t, f.addr), login{"backend", "backend", "backend-pw"}, func(p *paho.Publish) {
		got.add(p.Topic + " " + string(p.Payload))
	})
	if code := cons.subscribe(t, filter); code != 1 {
		t.Fatalf("consumer subscribe %s: 0x%02x", filter, code)
	}
	return got
}
