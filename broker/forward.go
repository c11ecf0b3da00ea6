package broker

import (
	"github.com/devicegate/devicegate/forward"

	"github.com/mochi-mqtt/server/v2/packets"
)

// Forwarder hands admitted messages on to upstreams durably
// (forward.Set).
type Forwarder interface {
	Forward(m *forward.Message) error
	// ForwardAsync queues m; the Queued's Wait returns once it is
	// durable, and its Ready says, without waiting, whether Wait would
	// return at once (None: no upstream takes m).
	ForwardAsync(m *forward.Message) (forward.Queued, error)
}

// forward hands device's pk to the upstreams, if any.
func (h *throttle) forward(device string, pk *packets.Packet) error {
	if h.fwd == nil {
		return nil
	}
	return h.fwd.Forward(forwardMessage(device, pk))
}

// forwardMessage is pk of device as the forward log keeps it: with the
// MQTT 5 properties that belong to the message (not the topic alias or
// subscription identifiers, which belong to one hop). Whatever the
// device's protocol: an MQTT 3.1.1 device's publish has none of its
// own, but a deferred one released carries the gateway's release stamp
// (devicelimit.ReleasedProperty), and an MQTT 5 upstream gets it as from
// an MQTT 5 device.
func forwardMessage(device string, pk *packets.Packet) *forward.Message {
	m := &forward.Message{Device: device, Topic: pk.TopicName, QoS: pk.FixedHeader.Qos, Retain: pk.FixedHeader.Retain, Payload: pk.Payload}
	p := &pk.Properties
	if p.PayloadFormatFlag || p.MessageExpiryInterval > 0 || p.ContentType != "" || p.ResponseTopic != "" ||
		len(p.CorrelationData) > 0 || len(p.User) > 0 {
		fp := &forward.Props{PayloadFormat: p.PayloadFormat, HasPayloadFormat: p.PayloadFormatFlag, MessageExpiry: p.MessageExpiryInterval,
			ContentType: p.ContentType, ResponseTopic: p.ResponseTopic, CorrelationData: p.CorrelationData}
		for _, u := range p.User {
			fp.User = append(fp.User, forward.UserProperty{Key: u.Key, Value: u.Val})
		}
		m.Props = fp
	}
	return m
}
