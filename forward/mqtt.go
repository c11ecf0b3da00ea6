package forward

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/devicegate/devicegate/internal/mqtt3"
	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// MQTT dials an upstream MQTT broker: MQTT 3.1.1 with
// paho.mqtt.golang, MQTT 5 with paho.golang (which carries the
// messages' properties).
type MQTT struct {
	// Address is the broker's host:port.
	Address string
	// V5 speaks MQTT 5 (else 3.1.1).
	V5 bool
	// TLS, when set, wraps the connection (mqtts://): the CA to trust
	// and, for mutual TLS, the client certificate.
	TLS *tls.Config
	// ClientID is the connection's client ID, unique upstream.
	ClientID string
	// Username and Password log in upstream, when Username is set.
	Username, Password string
	// KeepAlive is the MQTT keepalive (default 30 s).
	KeepAlive time.Duration
	// Persistent asks for a persistent session (clean session false):
	// the upstream keeps the Subscribe filters and queues the commands
	// published while the gateway is away.
	Persistent bool
	// Timeout bounds the connection and subscription handshakes
	// (default 5 s).
	Timeout time.Duration
	// WriteTimeout bounds how long an MQTT 3.1.1 publish waits for the
	// client's writer (default DefaultWriteTimeout): without it
	// paho.mqtt.golang's Publish waited 30 s on a connection the
	// upstream had closed gracefully, the forwarder blocked in it. (An
	// MQTT 5 publish waits at most Timeout for room in flight; the
	// socket's writes only fill a spool, see batchConn.)
	WriteTimeout time.Duration
	// Subscribe lists upstream topic filters whose messages Deliver
	// publishes locally, under Map's reverse mapping (commands to
	// devices).
	Subscribe []string
	Map       Map
	// Deliver publishes a command locally. A command is acknowledged
	// upstream only once Deliver returned nil (the broker then holds it
	// durably where it must, see broker.Server.Publish). An error means
	// it could not be kept: it is not acknowledged and the connection
	// ends, so that the upstream sends it again on the next one (with
	// Persistent). Deliver reports a command it cannot publish at all
	// itself, and returns nil for it.
	Deliver func(topic string, payload []byte, retain bool, qos byte) error
	// OnDeliverError is told about a command Deliver could not keep.
	OnDeliverError func(topic string, err error)
}

// Addr returns the broker's address, with the scheme.
func (d *MQTT) Addr() string {
	if d.TLS != nil {
		return "mqtts://" + d.Address
	}
	return "mqtt://" + d.Address
}

// Dial connects and subscribes to the Subscribe filters.
func (d *MQTT) Dial(ctx context.Context) (Conn, error) {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	keepAlive := d.KeepAlive
	if keepAlive <= 0 {
		keepAlive = 30 * time.Second
	}
	writeTimeout := d.WriteTimeout
	if writeTimeout <= 0 {
		writeTimeout = DefaultWriteTimeout
	}
	if d.V5 {
		return d.dial5(ctx, timeout, keepAlive)
	}
	conn := &mqttConn{Ending: NewEnding()}
	broker := "tcp://" + d.Address
	if d.TLS != nil {
		broker = "ssl://" + d.Address
	}
	opts := mqtt.NewClientOptions().
		AddBroker(broker).
		SetClientID(d.ClientID).
		SetProtocolVersion(4).
		SetCleanSession(!d.Persistent).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetConnectTimeout(timeout).
		SetKeepAlive(keepAlive).
		SetWriteTimeout(writeTimeout).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) { conn.EndWith(err) })
	// Our own dial, to read and write through a batchConn.
	opts.SetCustomOpenConnectionFn(func(*url.URL, mqtt.ClientOptions) (net.Conn, error) {
		bc, err := d.dial(ctx, timeout)
		if err != nil {
			return nil, err
		}
		conn.bc = bc
		return bc, nil
	})
	if d.Username != "" {
		opts.SetUsername(d.Username).SetPassword(d.Password)
	}
	commands := len(d.Subscribe) > 0 && d.Deliver != nil
	// A command is acknowledged once delivered (handler), not when it
	// arrives.
	opts.SetAutoAckDisabled(commands)
	if commands {
		// paho calls the handler on one goroutine, in arrival order, and
		// sends each PUBACK when Ack is called. It is the default handler,
		// in place before the CONNECT: an upstream that kept the session
		// sends its queued commands right after the CONNACK, before the
		// SUBSCRIBE below gives paho a route, and paho drops, unacknowledged,
		// a message no handler takes (the upstream then holds it in flight
		// and, once its in-flight window is full, sends nothing more).
		opts.SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) {
			if d.deliver(m.Topic(), m.Payload(), m.Retained(), m.Qos(), conn.Ending) {
				m.Ack()
			}
		})
	}
	c, kept, err := mqtt3.ConnectSession(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", d.Addr(), err)
	}
	conn.c = c
	if commands {
		filters := make(map[string]byte, len(d.Subscribe))
		for _, s := range d.Subscribe {
			filters[s] = 1
		}
		tok := c.SubscribeMultiple(filters, nil) // the default handler takes them
		if kept {
			subscribeKept(conn.Ending, func() error {
				if tok.Wait(); tok.Error() != nil {
					return fmt.Errorf("subscribe upstream to %v: %v", d.Subscribe, tok.Error())
				}
				return nil
			})
		} else if !tok.WaitTimeout(timeout) || tok.Error() != nil {
			c.Disconnect(0)
			return nil, fmt.Errorf("subscribe upstream to %v: %v", d.Subscribe, tok.Error())
		}
	}
	return conn, nil
}

// subscribeKept waits for the answer to the SUBSCRIBE (wait) in the
// background, ending the connection e when it fails. It serves a
// connection whose session the upstream kept (persistent_session, the
// CONNACK's session present): the upstream kept the subscriptions too,
// and first delivers the commands it queued for the session while the
// gateway was away, each stored durably before the next is read, so the
// SUBACK comes after them, however long they take (a backlog of
// thousands, an fsync each, on a loaded disk). Waiting for it within
// the connection's timeout failed the connection and started the
// backlog again, for ever.
func subscribeKept(e *Ending, wait func() error) {
	go func() {
		if err := wait(); err != nil {
			e.EndWith(err)
		}
	}()
}

// deliver hands a command from upstream to Deliver and reports whether
// to acknowledge it; when Deliver could not keep it, it ends the
// connection e, so that the upstream sends the command again.
func (d *MQTT) deliver(upTopic string, payload []byte, retain bool, qos byte, e *Ending) bool {
	topic := d.Map.Down(upTopic)
	err := d.Deliver(topic, payload, retain, qos)
	if err == nil {
		return true
	}
	if d.OnDeliverError != nil {
		d.OnDeliverError(topic, err)
	}
	e.EndWith(fmt.Errorf("command on %s not kept, not acknowledged: %w", upTopic, err))
	return false
}

// DefaultWriteTimeout is MQTT.WriteTimeout's default: a write that
// waits longer means the upstream stopped reading.
const DefaultWriteTimeout = time.Second

// dial opens the TCP or TLS connection, reading and writing through a
// batchConn.
func (d *MQTT) dial(ctx context.Context, timeout time.Duration) (*batchConn, error) {
	dialer := &net.Dialer{Timeout: timeout}
	var c net.Conn
	var err error
	if d.TLS != nil {
		c, err = (&tls.Dialer{NetDialer: dialer, Config: d.TLS}).DialContext(ctx, "tcp", d.Address)
	} else {
		c, err = dialer.DialContext(ctx, "tcp", d.Address)
	}
	if err != nil {
		return nil, err
	}
	return newBatchConn(c), nil
}

type mqttConn struct {
	c  mqtt.Client
	bc *batchConn // the socket paho reads and writes
	*Ending
}

// Hold and Release make mqttConn a holder: the publishes of a batch
// leave in one write.
func (c *mqttConn) Hold()    { c.bc.Hold() }
func (c *mqttConn) Release() { c.bc.Release() }

func (c *mqttConn) Send(m *Message, qos byte) Ack {
	return v3Ack{c.c.Publish(m.Topic, qos, m.Retain, m.Payload)}
}

// v3Ack is a paho token whose failure for a connection lost (paho
// completes the tokens in flight with "connection lost before Publish
// completed", before it reports the loss) is ErrEnded.
type v3Ack struct{ mqtt.Token }

func (a v3Ack) Error() error {
	err := a.Token.Error()
	if err != nil && strings.HasPrefix(err.Error(), "connection lost before") {
		return fmt.Errorf("%w (%v)", ErrEnded, err)
	}
	return err
}

func (c *mqttConn) Close() { c.c.Disconnect(0) }
