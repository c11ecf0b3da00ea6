// Package mqtttest holds the MQTT 5 test client that the gateway's
// in-process tests (server) and process tests (cmd/gateway) share.
package mqtttest

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// MQTT 5 reason codes the tests look for.
const (
	CodeSuccess       = 0x00
	CodeQuotaExceeded = 0x97
)

// Client5 is an MQTT 5 device connection (paho.golang), used to read
// the reason codes of PUBACKs.
type Client5 struct {
	c    *paho.Client
	once sync.Once
	lost chan struct{} // closed when the connection ends
}

// Dial5 connects an MQTT 5 client with a clean start, failing the test
// if the gateway does not accept it within 10 s. The test's cleanup
// disconnects it.
func Dial5(t *testing.T, addr, id string) *Client5 {
	t.Helper()
	return DialLogin5(t, addr, id, "", "")
}

// DialLogin5 is Dial5 with a username and password (none when "").
func DialLogin5(t *testing.T, addr, id, username, password string) *Client5 {
	t.Helper()
	cl, err := dial5(addr, id, username, password)
	if err != nil {
		t.Fatalf("connect %s to %s: %v", id, addr, err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// TryDial5 is Dial5 for a gateway that may refuse or be away: it
// returns the error. The caller closes the client.
func TryDial5(addr, id string) (*Client5, error) {
	return dial5(addr, id, "", "")
}

func dial5(addr, id, username, password string) (*Client5, error) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	cl := &Client5{lost: make(chan struct{})}
	end := func() { cl.once.Do(func() { close(cl.lost) }) }
	cl.c = paho.NewClient(paho.ClientConfig{
		ClientID:           id,
		Conn:               conn,
		OnServerDisconnect: func(*paho.Disconnect) { end() },
		OnClientError:      func(error) { end() },
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cp := &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}
	if username != "" {
		cp.Username, cp.UsernameFlag = username, true
	}
	if password != "" {
		cp.Password, cp.PasswordFlag = []byte(password), true
	}
	if _, err := cl.c.Connect(ctx, cp); err != nil {
		conn.Close()
		return nil, err
	}
	return cl, nil
}

// Lost is closed when the connection ends.
func (cl *Client5) Lost() <-chan struct{} { return cl.lost }

// Publish sends a QoS 1 message and returns the PUBACK's reason code.
// An error means no PUBACK came (the connection ended, or none within
// 5 s); a refusal (code >= 0x80) is not an error.
func (cl *Client5) Publish(topic, payload string) (byte, error) {
	return cl.PublishPacket(&paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload)})
}

// PublishPacket is Publish of a whole PUBLISH (properties, QoS).
func (cl *Client5) PublishPacket(p *paho.Publish) (byte, error) {
	code, _, err := cl.publish(p)
	return code, err
}

// PublishReason is Publish that also returns the PUBACK's reason string.
func (cl *Client5) PublishReason(topic, payload string) (byte, string, error) {
	return cl.publish(&paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload)})
}

func (cl *Client5) publish(p *paho.Publish) (byte, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cl.c.Publish(ctx, p)
	if resp == nil {
		return 0, "", err
	}
	var reason string
	if resp.Properties != nil {
		reason = resp.Properties.ReasonString
	}
	return resp.ReasonCode, reason, nil // paho reports a code >= 0x80 as an error too
}

// MustPublish publishes and fails the test unless the PUBACK carries
// want.
func (cl *Client5) MustPublish(t *testing.T, topic, payload string, want byte) {
	t.Helper()
	code, err := cl.Publish(topic, payload)
	if err != nil {
		t.Fatalf("publish %q to %s: %v", payload, topic, err)
	}
	if code != want {
		t.Fatalf("publish %q to %s: PUBACK 0x%02x, want 0x%02x", payload, topic, code, want)
	}
}

// Close disconnects the client.
func (cl *Client5) Close() {
	_ = cl.c.Disconnect(&paho.Disconnect{ReasonCode: 0})
}

// Subscribe5 connects an MQTT 5 client with a clean start, subscribes
// it with sub, and calls on for every message it receives (on paho's
// goroutine). The client is returned for publishing; the test's cleanup
// disconnects it.
func Subscribe5(t *testing.T, addr, id string, sub paho.SubscribeOptions, on func(*paho.Publish)) *paho.Client {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	c := paho.NewClient(paho.ClientConfig{ClientID: id, Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			on(pr.Packet)
			return true, nil
		}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil {
		conn.Close()
		t.Fatalf("connect %s to %s: %v", id, addr, err)
	}
	t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}) })
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{sub}}); err != nil {
		t.Fatalf("%s: subscribe %q: %v", id, sub.Topic, err)
	}
	return c
}

// ConnectCode sends an MQTT 5 CONNECT of id to addr and returns the
// CONNACK's reason code and reason string: 0 when accepted (the
// connection is then closed).
func ConnectCode(t *testing.T, addr, id string) (byte, string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := paho.NewClient(paho.ClientConfig{ClientID: id, Conn: conn})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ca, err := c.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30})
	if err == nil {
		_ = c.Disconnect(&paho.Disconnect{})
		return 0, ""
	}
	if ca == nil {
		t.Fatalf("connect %s: %v, and no CONNACK", id, err)
	}
	return ca.ReasonCode, ca.Properties.ReasonString
}
