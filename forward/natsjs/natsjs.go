// Package natsjs is the NATS JetStream destination of a forward log:
// each message is published to a subject made from its MQTT topic, with
// its forward ID as the JetStream message ID (Nats-Msg-Id), so a message
// sent again after an outage or a crash is stored once if the stream
// still remembers the ID (its duplicate window). Publishes are
// asynchronous; a message counts as acknowledged once JetStream
// acknowledged storing it. It implements forward.Dialer and
// forward.Conn.
package natsjs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/devicegate/devicegate/forward"
)

// Dialer connects to a NATS server (or cluster) with JetStream.
type Dialer struct {
	// URLs are the servers, comma-separated ("nats://host:4222,...").
	URLs string
	// Options are the connection's (credentials, TLS); Dial adds its
	// own timeouts and turns off the client's reconnection: the
	// forwarder dials again, and sends again from its log.
	Options []nats.Option
	// Subject names a message's subject: "{topic}" and "{device}" are
	// replaced by its MQTT topic and device made subject tokens
	// (Subject); "{topic}" when empty.
	Subject string
}

// Addr names the destination in logs.
func (d *Dialer) Addr() string { return d.URLs }

// maxPending bounds the client's publishes awaiting acknowledgement;
// the forwarder's window (max_inflight, at most 65535) is the real
// bound.
const maxPending = 1 << 16

// Dial connects and checks that JetStream answers.
func (d *Dialer) Dial(ctx context.Context) (forward.Conn, error) {
	c := &conn{d: d, Ending: forward.NewEnding(), futures: make(chan *sent, maxPending), done: make(chan struct{})}
	opts := append([]nats.Option{nats.Name("github.com/devicegate/devicegate"), nats.Timeout(5 * time.Second), nats.NoReconnect(),
		nats.ClosedHandler(func(nc *nats.Conn) { c.EndWith(nc.LastError()) })}, d.Options...)
	nc, err := nats.Connect(d.URLs, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", d.URLs, err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(maxPending))
	if err == nil {
		_, err = js.AccountInfo(ctx)
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("JetStream at %s: %w", d.URLs, err)
	}
	c.nc, c.js = nc, js
	c.subject = forward.ParseTemplate(d.Subject, "{topic}")
	go c.run()
	return c, nil
}

// Subject returns the subject of a message on topic from device under
// template tmpl: the topic's levels become tokens ('/' → '.'), and in
// the topic's levels and the device, what a subject token cannot hold
// ('.', '*', '>', white space, and an empty level) becomes '_'.
func Subject(tmpl, topic, device string) string {
	return forward.ParseTemplate(tmpl, "{topic}").Expand(topic, device, tokens)
}

// tokens appends s to b as subject tokens: a topic's levels each a
// token, a device one token.
func tokens(b []byte, s string, topic bool) []byte {
	start := len(b) // of the current token
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '/':
			if !topic {
				b = append(b, '_')
				continue
			}
			if len(b) == start {
				b = append(b, '_') // an empty level
			}
			b = append(b, '.')
			start = len(b)
		case '.', '*', '>', ' ', '\t', '\r', '\n':
			b = append(b, '_')
		default:
			b = append(b, c)
		}
	}
	if len(b) == start {
		b = append(b, '_')
	}
	return b
}

type conn struct {
	d       *Dialer
	subject forward.Template
	nc      *nats.Conn
	js      jetstream.JetStream
	*forward.Ending

	// futures holds, in order, what was published and not yet answered;
	// run completes each in turn.
	futures chan *sent
	mu      sync.Mutex
	closed  bool
	done    chan struct{}
}

// sent is one message published, and its acknowledgement.
type sent struct {
	f   jetstream.PubAckFuture
	ack *forward.Pending
}

func (c *conn) Send(m *forward.Message, qos byte) forward.Ack {
	msg := &nats.Msg{Subject: c.subject.Expand(m.Topic, m.Device, tokens), Data: m.Payload, Header: nats.Header{
		"topic":  {m.Topic},
		"device": {m.Device},
		"at":     {strconv.FormatInt(m.At.UnixMilli(), 10)},
		"qos":    {strconv.Itoa(int(m.QoS))},
	}}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return forward.Failed(errors.New("connection closed"))
	}
	// No retries by the client: it publishes a message no stream
	// answered again 250 ms later, by then after later messages, which
	// a stream re-created meanwhile stores first. Failed at once, the
	// message is sent again by the forwarder, in order.
	f, err := c.js.PublishMsgAsync(msg, jetstream.WithMsgID(m.ID), jetstream.WithRetryAttempts(0))
	if err != nil {
		err = fmt.Errorf("publish to %s on %s: %w", msg.Subject, c.d.URLs, err)
		if errors.Is(err, nats.ErrMaxPayload) {
			// Refused by the client before it was sent: the connection
			// goes on.
			return forward.Failed(forward.Refuse("too_large", err))
		}
		c.EndWith(err)
		return forward.Failed(err)
	}
	s := &sent{f: f, ack: forward.NewPending()}
	c.futures <- s // never blocks: the client refuses more than maxPending
	return s.ack
}

// run completes the acknowledgements in the order of the publishes.
func (c *conn) run() {
	defer close(c.done)
	for s := range c.futures {
		var err error
		select {
		case <-s.f.Ok():
		case err = <-s.f.Err():
			err = refusal(fmt.Errorf("publish to %s on %s: %w", s.f.Msg().Subject, c.d.URLs, explain(err)))
		case <-c.Lost():
			err = forward.ErrEnded
		}
		s.ack.Finish(err)
	}
}

// refusal returns err as a refusal for good when JetStream refused the
// message itself: larger than the stream takes (max_msg_size), or
// larger than the server's max_payload. Anything else (no stream for
// the subject yet, a timeout, a leader change) is sent again.
func refusal(err error) error {
	if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) {
		return forward.Refuse("too_large", err)
	}
	return err
}

// explain says what to do about the error of a publish no stream takes.
func explain(err error) error {
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("%w (no JetStream stream holds the subject: create one, e.g. nats stream add)", err)
	}
	return err
}

// Close ends the connection; what was not answered yet fails.
func (c *conn) Close() {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.futures)
	}
	c.mu.Unlock()
	c.End()
	<-c.done
	c.nc.Close()
}
