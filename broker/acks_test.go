package broker

import (
	"context"
	"testing"

	"github.com/eclipse/paho.golang/paho"
)

// TestAllowedPublishWithUserPropertiesAcksSuccess: an admitted MQTT 5
// publish carrying user properties is acknowledged with reason code
// 0x00, at QoS 1 (PUBACK) and QoS 2 (PUBREC). mochi by default copies the
// publish's properties into its ack, which then goes out with reason
// code 0x01, not a PUBACK code at all (MQTT 5, 3.4.2.1): paho and MQTT.js
// clients fail the publish.
func TestAllowedPublishWithUserPropertiesAcksSuccess(t *testing.T) {
	f := start(t, fixtureOpts{})
	c := f.dial5(t, "meter-1", "", nil)
	for _, qos := range []byte{1, 2} {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		resp, err := c.Publish(ctx, &paho.Publish{
			Topic: "devices/meter-1", QoS: qos, Payload: []byte("x"),
			Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "site", Value: "7"}}},
		})
		cancel()
		if err != nil {
			t.Fatalf("QoS %d publish with user properties: %v (response %+v)", qos, err, resp)
		}
		if resp == nil || resp.ReasonCode != 0 {
			t.Fatalf("QoS %d publish with user properties: response %+v, want reason code 0x00", qos, resp)
		}
	}
}

// TestForwardedPublishKeepsMessageExpiry: a subscriber gets the Message
// Expiry Interval the publisher sent, and none when the publisher sent
// none (mochi would otherwise add its 86 400 s maximum to every message).
func TestForwardedPublishKeepsMessageExpiry(t *testing.T) {
	f := start(t, fixtureOpts{})
	got := make(chan *paho.Publish, 2)
	sub := f.dial5(t, "backend", "", func(p *paho.Publish) { got <- p })
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := sub.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "devices/#", QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	pub := f.dial5(t, "meter-1", "", nil)
	expiry := uint32(600)
	for _, p := range []*paho.Publish{
		{Topic: "devices/meter-1", QoS: 1, Payload: []byte("none")},
		{Topic: "devices/meter-1", QoS: 1, Payload: []byte("600"), Properties: &paho.PublishProperties{MessageExpiry: &expiry}},
	} {
		if _, err := pub.Publish(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	first, second := receive(t, "message without expiry", got), receive(t, "message with expiry", got)
	if first.Properties != nil && first.Properties.MessageExpiry != nil {
		t.Errorf("message sent without an expiry arrived with Message Expiry Interval %d, want none", *first.Properties.MessageExpiry)
	}
	if second.Properties == nil || second.Properties.MessageExpiry == nil {
		t.Fatalf("message sent with expiry 600 arrived without one")
	}
	if e := *second.Properties.MessageExpiry; e < 599 || e > 600 {
		t.Errorf("message sent with expiry 600 arrived with %d", e)
	}
}
