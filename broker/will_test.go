package broker

import (
	"net"
	"strings"
	"testing"

	"github.com/eclipse/paho.golang/paho"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"

	"devicegate/devicelimit"
)

// TestWillCountsAgainstQuota: a will is a publish the broker makes for
// the device when its connection drops. A device over its quota that
// reconnects with a will and drops the connection, again and again, must
// not get one uncounted message through per reconnect: beyond the
// quota, one will per window goes out (presence), no more.
func TestWillCountsAgainstQuota(t *testing.T) {
	creds := credentials(t)
	f := start(t, fixtureOpts{
		rules: []devicelimit.Rule{rule("dev-1", 3, devicelimit.PolicyDrop)},
		options: func(o *Options) {
			o.Auth = Auth{Credentials: creds, ACL: defaultACL(t)}
		},
	})
	got := consume(t, f, "devices/#")

	// dev-1 spends its whole quota (the clock stands still).
	dev := mustConnect5(t, dialTCP(t, f.addr), login{"dev-1", "dev-1", "dev-1-pw"}, nil)
	for i := range 4 {
		want := byte(0)
		if i == 3 {
			want = packets.ErrQuotaExceeded.Code
		}
		if a, err := dev.publish(t, "devices/dev-1/temp", "m", 1); err != nil || a.code != want {
			t.Fatalf("publish %d: 0x%02x, %v; want 0x%02x", i, a.code, err, want)
		}
	}
	dev.close()

	// Now reconnect with a will, and drop the TCP connection.
	const cycles = 5
	for i := range cycles {
		conn := dialTCP(t, f.addr)
		c := paho.NewClient(paho.ClientConfig{ClientID: "dev-1", Conn: conn, PingHandler: noPinger{}})
		ctx, cancel := contextTimeout()
		_, err := c.Connect(ctx, &paho.Connect{ClientID: "dev-1", CleanStart: true, KeepAlive: 30,
			Username: "dev-1", UsernameFlag: true, Password: []byte("dev-1-pw"), PasswordFlag: true,
			WillMessage: &paho.WillMessage{Topic: "devices/dev-1/status", Payload: []byte("will"), QoS: 1}})
		cancel()
		if err != nil {
			t.Fatalf("cycle %d: connect: %v", i, err)
		}
		_ = conn.(*net.TCPConn).SetLinger(0)
		_ = conn.Close() // no DISCONNECT: the broker sends the will
		eventually(t, "the broker to end dev-1's connection", func() bool {
			_, ok := f.srv.mqtt.Clients.Get("dev-1") // removed after the will went out
			return !ok
		})
	}
	// A marker through the same consumer, after every disconnect was
	// handled: anything the wills produced arrived before it.
	other := mustConnect5(t, dialTCP(t, f.addr), login{"dev-2", "dev-2", "dev-2-pw"}, nil)
	if a, err := other.publish(t, "devices/dev-2/marker", "end", 1); err != nil || a.code != 0 {
		t.Fatalf("marker: 0x%02x, %v", a.code, err)
	}
	msgs := got.waitMarker(t, "devices/dev-2/marker end")
	n := 0
	for _, m := range msgs {
		if m == "devices/dev-1/temp m" || m == "devices/dev-1/status will" {
			n++
		}
	}
	if n != 3+1 {
		t.Fatalf("dev-1 got %d messages through with a quota of 3 and %d wills over it: %q; want 3 + 1 will", n, cycles, msgs)
	}
}

// TestConsumerWillRefused: a consumer publishes nowhere, not even by a
// will, on MQTT 5 or 3.1.1.
func TestConsumerWillRefused(t *testing.T) {
	creds := credentials(t)
	f := start(t, fixtureOpts{options: func(o *Options) { o.Auth = Auth{Credentials: creds, ACL: defaultACL(t)} }})
	c := paho.NewClient(paho.ClientConfig{ClientID: "backend", Conn: dialTCP(t, f.addr), PingHandler: noPinger{}})
	ctx, cancel := contextTimeout()
	ca, err := c.Connect(ctx, &paho.Connect{ClientID: "backend", CleanStart: true, KeepAlive: 30,
		Username: "backend", UsernameFlag: true, Password: []byte("backend-pw"), PasswordFlag: true,
		WillMessage: &paho.WillMessage{Topic: "devices/dev-1/cmd/reboot", Payload: []byte("now"), QoS: 2, Retain: true}})
	cancel()
	if err == nil || ca == nil || ca.ReasonCode != packets.ErrNotAuthorized.Code {
		t.Fatalf("consumer with a will: %v, connack %+v; want 0x87", err, ca)
	}
	opts := mqtt3.NewClientOptions().AddBroker("tcp://"+f.addr).SetClientID("backend").SetUsername("backend").
		SetPassword("backend-pw").SetProtocolVersion(4).SetAutoReconnect(false).SetConnectTimeout(waitTimeout).
		SetWill("devices/dev-1/cmd/reboot", "now", 1, true)
	tok := mqtt3.NewClient(opts).Connect()
	if !tok.WaitTimeout(waitTimeout) || tok.Error() == nil || !strings.Contains(tok.Error().Error(), "not Authorized") {
		t.Fatalf("MQTT 3.1.1 consumer with a will: %v; want refused, not authorized", tok.Error())
	}
}
