package simulator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.golang/paho"
	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/devicegate/devicegate/internal/mqtt3"
)

// ackTimeout bounds the wait for a PUBACK (or PUBREC, PUBCOMP). On an
// overloaded machine acks can take seconds; a device that gives up on
// one counts as disconnected, so the bound is generous.
const ackTimeout = 30 * time.Second

// publisher is one device's connection.
type publisher interface {
	// publish sends payload and returns what the gateway said. An error
	// means the connection is gone.
	publish(ctx context.Context, topic string, payload []byte) (Ack, byte, error)
	close()
}

// client5 is an MQTT 5 device (paho.golang).
type client5 struct {
	c   *paho.Client
	qos byte
	// alive ends with the connection: paho.golang keeps an in-flight
	// publish waiting for its ack after the connection is gone (for a
	// resend on a later session), and the device must learn of the loss
	// now.
	alive context.Context
	// disconnect is the reason code of the gateway's DISCONNECT, set
	// before disconnected is closed, if it sent one.
	disconnect   atomic.Uint32
	disconnected chan struct{}
}

func dial5(ctx context.Context, addr, id string, qos byte, auth Auth, w *wireCount) (*client5, error) {
	conn, err := auth.dialConn(ctx, addr, w)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	cl := &client5{qos: qos, disconnected: make(chan struct{})}
	c := paho.NewClient(paho.ClientConfig{ClientID: id, Conn: conn, PacketTimeout: ackTimeout,
		OnServerDisconnect: func(d *paho.Disconnect) {
			cl.disconnect.Store(uint32(d.ReasonCode))
			close(cl.disconnected)
		}})
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if ca, err := c.Connect(cctx, connect5(id, auth.Username, auth.Password, deviceReceiveMaximum)); err != nil {
		conn.Close()
		return nil, refused5(ca, err)
	}
	alive, gone := context.WithCancel(context.Background())
	go func() {
		<-c.Done()
		gone()
	}()
	cl.c, cl.alive = c, alive
	return cl, nil
}

func (c *client5) publish(_ context.Context, topic string, payload []byte) (Ack, byte, error) {
	// The wait for the ack outlives the run's end, so that the outcome
	// of the last message is known, but not the connection.
	pctx, cancel := context.WithTimeout(c.alive, ackTimeout)
	defer cancel()
	resp, err := c.c.Publish(pctx, &paho.Publish{Topic: topic, QoS: c.qos, Payload: payload})
	if err != nil && resp == nil && c.blocked() { // no PUBACK: the connection ended
		err = fmt.Errorf("%w: DISCONNECT 0x98: %v", ErrBlocked, err)
	}
	if c.qos == 0 {
		return AckNone, 0, err
	}
	if resp == nil {
		if err == nil {
			err = errors.New("publish: no response")
		}
		return AckNone, 0, err
	}
	if resp.ReasonCode >= 0x80 {
		return AckRefused, resp.ReasonCode, nil // paho reports it as an error too
	}
	return AckSuccess, resp.ReasonCode, nil
}

// blocked reports whether the gateway ended the connection with
// DISCONNECT 0x98 (administrative action: automatic blocking). paho
// calls back about a DISCONNECT after the connection is closed, in a
// goroutine of its own: wait a moment for it.
func (c *client5) blocked() bool {
	select {
	case <-c.disconnected:
		return c.disconnect.Load() == 0x98
	case <-time.After(time.Second):
		return false
	}
}

func (c *client5) close() {
	_ = c.c.Disconnect(&paho.Disconnect{ReasonCode: 0})
	<-c.c.Done()
}

// client4 is an MQTT 3.1.1 device (paho.mqtt.golang).
type client4 struct {
	c   mqtt.Client
	qos byte
}

func dial4(ctx context.Context, addr, id string, qos byte, auth Auth, w *wireCount) (*client4, error) {
	scheme := "tcp://"
	if auth.TLS != nil {
		scheme = "ssl://"
	}
	opts := mqtt.NewClientOptions().
		AddBroker(scheme + addr).
		SetClientID(id).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetConnectTimeout(10 * time.Second)
	if auth.TLS != nil {
		opts.SetTLSConfig(auth.TLS)
	}
	if auth.Username != "" {
		opts.SetUsername(auth.Username).SetPassword(auth.Password)
	}
	if w != nil {
		opts.SetCustomOpenConnectionFn(func(*url.URL, mqtt.ClientOptions) (net.Conn, error) {
			return auth.dialConn(ctx, addr, w)
		})
	}
	c, err := mqtt3.Connect(ctx, opts)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, refused4(err)
	}
	return &client4{c: c, qos: qos}, nil
}

func (c *client4) publish(ctx context.Context, topic string, payload []byte) (Ack, byte, error) {
	tok := c.c.Publish(topic, c.qos, false, payload)
	if !tok.WaitTimeout(ackTimeout) {
		return AckNone, 0, fmt.Errorf("publish: no PUBACK within %s", ackTimeout)
	}
	// A 3.1.1 PUBACK has no reason code: the client learns nothing
	// about the gateway's verdict.
	return AckNone, 0, tok.Error()
}

func (c *client4) close() { c.c.Disconnect(100) }
