package broker

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/eclipse/paho.golang/paho"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
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
	for range cycles {
		dropWithWill(t, f, &paho.Connect{ClientID: "dev-1", CleanStart: true, KeepAlive: 30,
			Username: "dev-1", UsernameFlag: true, Password: []byte("dev-1-pw"), PasswordFlag: true,
			WillMessage: &paho.WillMessage{Topic: "devices/dev-1/status", Payload: []byte("will"), QoS: 1}})
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

// dropWithWill connects with c (which carries a will), then drops the
// TCP connection without DISCONNECT and waits until the broker has
// ended the client, its will handled.
func dropWithWill(t *testing.T, f *fixture, c *paho.Connect) {
	t.Helper()
	conn := dialTCP(t, f.addr)
	cl := paho.NewClient(paho.ClientConfig{ClientID: c.ClientID, Conn: conn, PingHandler: noPinger{}})
	ctx, cancel := contextTimeout()
	defer cancel()
	if _, err := cl.Connect(ctx, c); err != nil {
		t.Fatalf("connect %s: %v", c.ClientID, err)
	}
	_ = conn.(*net.TCPConn).SetLinger(0)
	_ = conn.Close() // no DISCONNECT: the broker sends the will
	eventually(t, "the broker to end "+c.ClientID+"'s connection", func() bool {
		_, ok := f.srv.mqtt.Clients.Get(c.ClientID) // removed after the will went out
		return !ok
	})
}

// willConnect is an anonymous MQTT 5 CONNECT of id with a QoS 1 will.
func willConnect(id, topic, payload string) *paho.Connect {
	return &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30,
		WillMessage: &paho.WillMessage{Topic: topic, Payload: []byte(payload), QoS: 1}}
}

// TestWillCountsAgainstGroup: a will is a message of its device's group
// too. An admitted will takes a place in the group's window (the
// tenant's next publish is refused); once the group's window is full, a
// device's will goes out only as the one will per window beyond the
// quota, as a device's own full window allows.
func TestWillCountsAgainstGroup(t *testing.T) {
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{tenantRule(devicelimit.PolicyDrop)}}) // group acme: 3 a second
	got := f.subscribe(t, "sub", "", "status/#")
	a := f.connect(t, 5, "t-acme-1", "")
	for i := range 2 {
		if r, err := a.publish(t, "x/1", "m", 1); err != nil || r.code != 0 {
			t.Fatalf("publish %d: 0x%02x %v", i, r.code, err)
		}
	}
	dropWithWill(t, f, willConnect("t-acme-2", "status/t-acme-2", "offline-1"))
	if r, err := a.publish(t, "x/1", "m", 1); err != nil || r.code != 0x97 {
		t.Fatalf("after the will, the group's 4th: 0x%02x %v, want 0x97", r.code, err)
	}
	dropWithWill(t, f, willConnect("t-acme-2", "status/t-acme-2", "offline-2")) // beyond: goes out
	dropWithWill(t, f, willConnect("t-acme-2", "status/t-acme-2", "offline-3")) // dropped
	// A marker from a device in no group: what the wills sent arrived
	// before it.
	if r, err := f.connect(t, 5, "other", "").publish(t, "status/other", "marker", 1); err != nil || r.code != 0 {
		t.Fatalf("marker: 0x%02x %v", r.code, err)
	}
	eventually(t, "the marker", func() bool { return got.has("marker") })
	if got.has("offline-3") || !got.has("offline-1") || !got.has("offline-2") {
		t.Fatalf("wills received %q: want offline-1 (admitted) and offline-2 (one beyond the quota), not offline-3", got.payloads())
	}
	st := f.srv.Stats()
	if g := st.Groups["{tenant}"]; g[GroupAdmitted] != 3 || g[GroupRefused] != 3 {
		t.Fatalf("group stats %v, want 3 admitted (2 publishes, a will), 3 refused (a publish, 2 wills)", g)
	}
}

// TestWillInShadowMode: a device whose quota is in shadow mode has
// every will published, over its quota too, counted as would-refuse.
func TestWillInShadowMode(t *testing.T) {
	r := rule("dev-*", 1, devicelimit.PolicyDrop)
	r.Quota.Shadow = true
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{r}})
	got := f.subscribe(t, "sub", "", "status/#")
	for i := range 3 {
		dropWithWill(t, f, willConnect("dev-1", "status/dev-1", fmt.Sprint("offline-", i)))
	}
	eventually(t, "three wills", func() bool { return got.has("offline-2") })
	if !got.has("offline-0") || !got.has("offline-1") {
		t.Fatalf("wills received %q, want all three", got.payloads())
	}
	if st := f.srv.Stats(); st.WouldRefuse != 2 || st.Dropped != 0 {
		t.Fatalf("would-refuse %d, dropped %d; want 2 and 0", st.WouldRefuse, st.Dropped)
	}
}
