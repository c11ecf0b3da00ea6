package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"testing"

	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/log"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/gorilla/websocket"

	"github.com/devicegate/devicegate/auth"
	"github.com/devicegate/devicegate/internal/testcert"
)

// testCA is a certificate authority made for one test.
type testCA = testcert.CA

func newCA(t *testing.T, name string) *testCA { return testcert.NewCA(t, name) }

// serverTLS writes a server certificate and the client CA to files and
// loads them with auth.ServerTLS, as the gateway does.
func serverTLS(t *testing.T, ca *testCA, requireClientCert bool) *tls.Config {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile := testcert.WritePair(t, dir, "gateway", ca.Issue(t, "gateway", nil, true))
	cfg, err := auth.ServerTLS(certFile, keyFile, ca.WriteCA(t, dir, "ca.pem"), requireClientCert)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// clientTLS trusts ca for the server and presents certs.
func clientTLS(ca *testCA, certs ...tls.Certificate) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &tls.Config{RootCAs: pool, Certificates: certs, MinVersion: tls.VersionTLS12}
}

// login is what an MQTT 5 client sends at CONNECT.
type login struct {
	id, username, password string
}

// connect5 connects an MQTT 5 client over conn; onMsg, when set,
// receives messages. On a refused CONNECT the CONNACK is returned with
// the error.
func connect5(t *testing.T, conn net.Conn, l login, onMsg func(*paho.Publish)) (*pub5, *paho.Connack, error) {
	t.Helper()
	p := &pub5{lostCh: make(chan struct{})}
	cfg := paho.ClientConfig{ClientID: l.id, Conn: conn, OnServerDisconnect: p.onDisconnect, OnClientError: p.onError,
		PingHandler: noPinger{}, PacketTimeout: waitTimeout}
	if onMsg != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){
			func(r paho.PublishReceived) (bool, error) { onMsg(r.Packet); return true, nil },
		}
	}
	c := paho.NewClient(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	cp := &paho.Connect{ClientID: l.id, CleanStart: true, KeepAlive: 30}
	if l.username != "" {
		cp.Username, cp.UsernameFlag = l.username, true
	}
	if l.password != "" {
		cp.Password, cp.PasswordFlag = []byte(l.password), true
	}
	connack, err := c.Connect(ctx, cp)
	if err != nil {
		_ = conn.Close()
		return nil, connack, err
	}
	p.c = c
	t.Cleanup(p.close)
	return p, connack, nil
}

func dialTCP(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, waitTimeout)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// dialTLS completes a TLS handshake with addr; the error is the
// handshake's (a refused client certificate shows on the first read in
// TLS 1.3, so the caller's CONNECT fails then).
func dialTLS(t *testing.T, addr string, cfg *tls.Config) (net.Conn, error) {
	t.Helper()
	d := &net.Dialer{Timeout: waitTimeout}
	return tls.DialWithDialer(d, "tcp", addr, cfg)
}

// dialWS opens an MQTT WebSocket connection to addr.
func dialWS(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := websocket.Dialer{Subprotocols: []string{"mqtt"}, HandshakeTimeout: waitTimeout}
	c, _, err := d.Dial("ws://"+addr+"/mqtt", nil)
	if err != nil {
		t.Fatal(err)
	}
	return &wsConn{Conn: c.NetConn(), c: c}
}

// mustConnect5 connects or fails the test.
func mustConnect5(t *testing.T, conn net.Conn, l login, onMsg func(*paho.Publish)) *pub5 {
	t.Helper()
	p, connack, err := connect5(t, conn, l, onMsg)
	if err != nil {
		t.Fatalf("connect %+v: %v (connack %+v)", l, err, connack)
	}
	return p
}

// refusedWith connects and expects a CONNACK with code.
func refusedWith(t *testing.T, conn net.Conn, l login, code byte) string {
	t.Helper()
	_, connack, err := connect5(t, conn, l, nil)
	if err == nil {
		t.Fatalf("connect %+v succeeded, want refused with 0x%02x", l, code)
	}
	if connack == nil || connack.ReasonCode != code {
		t.Fatalf("connect %+v: %v, connack %+v; want reason code 0x%02x", l, err, connack, code)
	}
	return connackReason(connack)
}

// subscribe5 subscribes p to filter and returns the SUBACK code.
func (p *pub5) subscribe(t *testing.T, filter string) byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	sa, err := p.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
	if sa == nil {
		t.Fatalf("subscribe %s: %v", filter, err)
	}
	return sa.Reasons[0]
}

// dial3 connects an MQTT 3.1.1 client with a username and password.
func (f *fixture) dial3(t *testing.T, id, username, password string) (mqtt3.Client, error) {
	t.Helper()
	c := mqtt3.NewClient(mqtt3.NewClientOptions().AddBroker("tcp://" + f.addr).SetClientID(id).
		SetUsername(username).SetPassword(password).SetProtocolVersion(4).SetAutoReconnect(false).
		SetConnectRetry(false).SetConnectTimeout(waitTimeout))
	tok := c.Connect()
	if !tok.WaitTimeout(waitTimeout) {
		return nil, errors.New("connect timed out")
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Disconnect(0) })
	return c, nil
}

func contextTimeout() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), waitTimeout)
}

// dialWSS opens an MQTT WebSocket connection over TLS to addr.
func dialWSS(t *testing.T, addr string, cfg *tls.Config) (net.Conn, error) {
	t.Helper()
	d := websocket.Dialer{Subprotocols: []string{"mqtt"}, HandshakeTimeout: waitTimeout, TLSClientConfig: cfg}
	c, _, err := d.Dial("wss://"+addr+"/mqtt", nil)
	if err != nil {
		return nil, err
	}
	return &wsConn{Conn: c.NetConn(), c: c}, nil
}

// noPinger replaces paho's pinger, which sends its first PINGREQ at
// once, from its own goroutine, as several Writes (net.Buffers): on a
// TLS or WebSocket connection (no writev) they can interleave with a
// PUBLISH being written and corrupt both. The tests' connections live
// far shorter than a keepalive.
type noPinger struct{}

func (noPinger) Run(ctx context.Context, _ net.Conn, _ uint16) error { <-ctx.Done(); return nil }
func (noPinger) PacketSent()                                         {}
func (noPinger) PacketReceived()                                     {}
func (noPinger) PingResp()                                           {}
func (noPinger) SetDebug(log.Logger)                                 {}
