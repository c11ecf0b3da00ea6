package forward

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"
)

// MQTT dials an upstream MQTT broker: MQTT 3.1.1 with the forwarder's
// own client (mqtt3conn.go), MQTT 5 with paho.golang (which carries the
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
	// WriteTimeout bounds how long an MQTT 3.1.1 packet waits for room
	// in the connection's buffer (default DefaultWriteTimeout): a write
	// that waits longer means the upstream stopped reading, and ends the
	// connection (paho.mqtt.golang, without a write timeout, blocked the
	// forwarder 30 s on a connection the upstream had closed
	// gracefully). An MQTT 5 publish waits at most Timeout for room in
	// flight; the socket's writes only fill a spool, see batchConn.
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
	return d.dial3(ctx, timeout, keepAlive, writeTimeout)
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
