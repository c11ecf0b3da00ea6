// Package kafka is the Kafka destination of a forward log: each message
// becomes a record of a topic named from its MQTT topic, keyed by its
// device (so one device's records share a partition and keep their
// order), with headers for its forward ID, MQTT topic, device,
// acceptance time and QoS, produced by franz-go's idempotent producer
// with acks from all in-sync replicas. A message counts as acknowledged
// once Kafka acknowledged its record. It implements forward.Dialer and
// forward.Conn.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/devicegate/devicegate/forward"
)

// Dialer produces to one Kafka cluster.
type Dialer struct {
	// Seeds are the brokers to start from ("host:port").
	Seeds []string
	// Topic names a message's Kafka topic: "{topic}" and "{device}" are
	// replaced by its MQTT topic and device made topic-name characters
	// (TopicName).
	Topic string
	// Options are the client's own (SASL, TLS); Dial adds the producer's.
	Options []kgo.Opt
}

// Addr names the destination in logs.
func (d *Dialer) Addr() string { return "kafka://" + strings.Join(d.Seeds, ",") }

// Dial makes a producer and checks that a broker answers.
func (d *Dialer) Dial(ctx context.Context) (forward.Conn, error) {
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(d.Seeds...),
		kgo.ClientID("github.com/devicegate/devicegate"),
		kgo.RequiredAcks(kgo.AllISRAcks()), // the idempotent producer's default, said
		kgo.ProducerLinger(time.Millisecond),
		// No RecordDeliveryTimeout: franz-go counts it from the record's
		// Timestamp, which is the message's acceptance time, so after an
		// outage longer than the timeout every message of the backlog
		// timed out before it was sent, on every reconnection, and none
		// was ever delivered. The forwarder's acknowledgement timeout
		// (5 s for the oldest message in flight) ends a connection that
		// stops answering; Close then aborts what is buffered.
		kgo.DialTimeout(5 * time.Second),
	}, d.Options...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.Addr(), err)
	}
	if err := cl.Ping(ctx); err != nil {
		cl.Close()
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("%w: the broker closed the connection (a SASL login refused, or TLS on one side only?)", err)
		}
		return nil, fmt.Errorf("connect to %s: %w", d.Addr(), err)
	}
	return &conn{d: d, cl: cl, topic: forward.ParseTemplate(d.Topic, ""), Ending: forward.NewEnding()}, nil
}

// maxTopic is the longest Kafka topic name.
const maxTopic = 249

// TopicName returns the Kafka topic of a message on topic from device
// under template tmpl: in the MQTT topic '/' becomes '.', and in it and
// the device every character a topic name cannot hold (only ASCII
// letters, digits, '.', '_' and '-') becomes '_'; a name longer than
// Kafka allows is cut to 249 bytes.
func TopicName(tmpl, topic, device string) string {
	return topicName(forward.ParseTemplate(tmpl, ""), topic, device)
}

func topicName(t forward.Template, topic, device string) string {
	name := t.Expand(topic, device, clean)
	return name[:min(len(name), maxTopic)]
}

// clean appends s to b in topic-name characters ('/' of a topic made
// '.'): a character outside them is '_', each of its bytes.
func clean(b []byte, s string, topic bool) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-':
		case c == '/' && topic:
			c = '.'
		default:
			c = '_'
		}
		b = append(b, c)
	}
	return b
}

type conn struct {
	d     *Dialer
	topic forward.Template
	cl    *kgo.Client
	*forward.Ending
}

func (c *conn) Send(m *forward.Message, _ byte) forward.Ack {
	rec := &kgo.Record{Topic: topicName(c.topic, m.Topic, m.Device), Key: []byte(m.Device), Value: m.Payload, Timestamp: m.At,
		Headers: []kgo.RecordHeader{
			{Key: "id", Value: []byte(m.ID)},
			{Key: "topic", Value: []byte(m.Topic)},
			{Key: "device", Value: []byte(m.Device)},
			{Key: "at", Value: strconv.AppendInt(nil, m.At.UnixMilli(), 10)},
			{Key: "qos", Value: []byte{'0' + m.QoS}},
		}}
	p := forward.NewPending()
	c.cl.Produce(context.Background(), rec, func(r *kgo.Record, err error) {
		if err != nil {
			err = fmt.Errorf("produce to %s on %s: %w", r.Topic, c.d.Addr(), err)
			if reason, ok := refusal(err); ok {
				// This record alone: the connection goes on.
				p.Finish(forward.Refuse(reason, err))
				return
			}
			// A record that failed fails the partition's later ones
			// too; the forwarder sends again from its log.
			c.EndWith(err)
		}
		p.Finish(err)
	})
	return p
}

// refusal tells a record Kafka refused for good (sent again, it would
// be refused again) from a failure of the moment: larger than the
// producer's batch or the broker's message.max.bytes, a topic the
// client may not write or whose name is invalid, a record the broker
// takes for invalid.
func refusal(err error) (reason string, ok bool) {
	switch {
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return "too_large", true
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return "not_authorized", true
	case errors.Is(err, kerr.InvalidTopicException):
		return "invalid_topic", true
	case errors.Is(err, kerr.InvalidRecord), errors.Is(err, kerr.CorruptMessage):
		return "invalid_record", true
	}
	return "", false
}

// Close fails what Kafka has not acknowledged (the forwarder sends it
// again) and ends the producer.
func (c *conn) Close() {
	c.End()
	c.cl.UnsafeAbortBufferedRecords()
	c.cl.Close()
}
