package broker

import (
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"
	"golang.org/x/crypto/argon2"
	"golang.org/x/crypto/bcrypt"

	"github.com/devicegate/devicegate/auth"
	"github.com/devicegate/devicegate/devicelimit"
)

// credentials builds the accounts of the credentials tests: dev-1 and
// dev-2 (bcrypt), fleet (argon2id, client IDs fleet-*) and backend, a
// consumer. Every password is the username + "-pw".
func credentials(t *testing.T) *auth.Credentials {
	t.Helper()
	entries, err := testEntries()
	if err != nil {
		t.Fatal(err)
	}
	c, err := auth.New(entries)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testEntries hashes the test accounts' passwords once, at the lowest
// costs the formats allow: hashing is slow by design, the more so under
// the race detector, and each login verifies one. (The gateway's own
// costs are auth.HashPassword's.)
var testEntries = sync.OnceValues(func() ([]auth.Entry, error) {
	var entries []auth.Entry
	for _, e := range []auth.Entry{
		{Username: "dev-1"}, {Username: "dev-2"},
		{Username: "fleet", ClientIDs: []string{"fleet-*"}},
		{Username: "backend", Role: auth.RoleConsumer},
	} {
		pw := []byte(e.Username + "-pw")
		if e.Username == "fleet" {
			salt := []byte("0123456789abcdef")
			e.Hash = fmt.Sprintf("$argon2id$v=19$m=64,t=1,p=1$%s$%s", base64.RawStdEncoding.EncodeToString(salt),
				base64.RawStdEncoding.EncodeToString(argon2.IDKey(pw, salt, 1, 64, 1, 32)))
		} else {
			h, err := bcrypt.GenerateFromPassword(pw, bcrypt.MinCost)
			if err != nil {
				return nil, err
			}
			e.Hash = string(h)
		}
		entries = append(entries, e)
	}
	return entries, nil
})

func defaultACL(t *testing.T) auth.ACL {
	t.Helper()
	acl, err := auth.NewACL(auth.DefaultPublish, auth.DefaultSubscribe)
	if err != nil {
		t.Fatal(err)
	}
	return acl
}

// TestAuthCredentials: password mode refuses a wrong password, an
// unknown user, a missing username and a client ID the account may not
// use; the ACL keeps devices under their prefix and consumers reading.
func TestAuthCredentials(t *testing.T) {
	creds := credentials(t)
	f := start(t, fixtureOpts{
		rules: []devicelimit.Rule{rule("dev-1", 3, devicelimit.PolicyDrop)},
		options: func(o *Options) {
			o.Auth = Auth{Credentials: creds, ACL: defaultACL(t)}
		},
	})

	for _, tc := range []struct {
		name string
		l    login
		code byte
	}{
		{"wrong password", login{"dev-1", "dev-1", "dev-2-pw"}, 0x86},
		{"unknown device", login{"dev-9", "dev-9", "dev-9-pw"}, 0x86},
		{"no username", login{"dev-1", "", ""}, 0x86},
		{"client ID of another device", login{"dev-1", "dev-2", "dev-2-pw"}, 0x85},
		{"client ID outside the account's patterns", login{"dev-1", "fleet", "fleet-pw"}, 0x85},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refusedWith(t, dialTCP(t, f.addr), tc.l, tc.code)
		})
	}
	// MQTT 3.1.1 gets return code 4 (bad user name or password).
	p3, err := f.dial3(t, "dev-1", "dev-1", "nope")
	if err == nil || !strings.Contains(err.Error(), "bad user name or password") {
		t.Fatalf("MQTT 3.1.1 with a wrong password: %v, %v; want refused", p3, err)
	}
	// A will is a publish too: one outside the prefix refuses the CONNECT.
	wc := paho.NewClient(paho.ClientConfig{Conn: dialTCP(t, f.addr)})
	ctx, cancel := contextTimeout()
	ca, err := wc.Connect(ctx, &paho.Connect{ClientID: "dev-1", CleanStart: true, Username: "dev-1", UsernameFlag: true,
		Password: []byte("dev-1-pw"), PasswordFlag: true, WillMessage: &paho.WillMessage{Topic: "devices/dev-2/status", Payload: []byte("gone")}})
	cancel()
	if err == nil || ca == nil || ca.ReasonCode != packets.ErrNotAuthorized.Code {
		t.Fatalf("will on another device's topic: %v, connack %+v; want 0x87", err, ca)
	}
	refused := f.srv.AuthStats().ConnectsRefused
	if refused["credentials"] != 4 || refused["client_id"] != 2 || refused["will"] != 1 {
		t.Errorf("refusals %v, want credentials 4, client_id 2, will 1", refused)
	}

	backend := new(sink)
	cons := mustConnect5(t, dialTCP(t, f.addr), login{"backend", "backend", "backend-pw"}, func(p *paho.Publish) {
		backend.add(p.Topic + " " + string(p.Payload))
	})
	if code := cons.subscribe(t, "#"); code != 1 {
		t.Fatalf("consumer subscribe # = 0x%02x, want 0x01", code)
	}
	if a, _ := cons.publish(t, "devices/dev-1/temp", "forged", 1); a.code != packets.ErrNotAuthorized.Code {
		t.Errorf("consumer publish: 0x%02x, want 0x87", a.code)
	}

	dev := mustConnect5(t, dialTCP(t, f.addr), login{"dev-1", "dev-1", "dev-1-pw"}, nil)
	if code := dev.subscribe(t, "devices/dev-1/cmd/#"); code != 1 {
		t.Errorf("own command topics: SUBACK 0x%02x, want 0x01", code)
	}
	for _, filter := range []string{"devices/dev-2/cmd/#", "devices/+/cmd/#", "#"} {
		if code := dev.subscribe(t, filter); code != packets.ErrNotAuthorized.Code {
			t.Errorf("subscribe %s: SUBACK 0x%02x, want 0x87", filter, code)
		}
	}
	for _, topic := range []string{"devices/dev-2/temp", "other/dev-1", "devices"} {
		if a, _ := dev.publish(t, topic, "outside", 1); a.code != packets.ErrNotAuthorized.Code {
			t.Errorf("publish to %s: 0x%02x, want 0x87", topic, a.code)
		}
	}
	st := f.srv.AuthStats()
	if st.PublishDenied != 5 || st.SubscribeDenied != 3 {
		t.Errorf("denied publishes %d (will included), subscriptions %d; want 5 and 3", st.PublishDenied, st.SubscribeDenied)
	}
	if got := f.srv.Stats().Dropped + f.srv.Stats().Allowed; got != 0 {
		t.Errorf("ACL-refused publishes reached the throttle: %d decisions", got)
	}

	// A device cannot spend another device's quota: fleet's account may
	// not claim dev-1's client ID (refused above); whatever fleet-1
	// sends leaves dev-1's 3 messages intact.
	fl := mustConnect5(t, dialTCP(t, f.addr), login{"fleet-1", "fleet", "fleet-pw"}, nil)
	for i := range 5 {
		if a, err := fl.publish(t, "devices/fleet-1/t", "f", 1); err != nil || a.code != 0 {
			t.Fatalf("fleet-1 publish %d: 0x%02x %v", i, a.code, err)
		}
	}
	for i := range 3 {
		if a, err := dev.publish(t, "devices/dev-1/temp", "ok", 1); err != nil || a.code != 0 {
			t.Fatalf("dev-1 publish %d within quota: 0x%02x %v", i, a.code, err)
		}
	}
	if a, _ := dev.publish(t, "devices/dev-1/temp", "over", 1); a.code != packets.ErrQuotaExceeded.Code {
		t.Fatalf("dev-1's 4th publish: 0x%02x, want 0x97", a.code)
	}
	eventually(t, "consumer receives the devices' messages", func() bool { return len(backend.payloads()) == 8 })
}

// TestAuthCertificates: on the TLS listener a certificate from the
// configured CA authenticates its CN; a certificate from another CA, no
// certificate, and a client ID other than the CN are refused, and so is
// a plain TCP client when only certificates authenticate.
func TestAuthCertificates(t *testing.T) {
	ca, other := newCA(t, "fleet CA"), newCA(t, "rogue CA")
	f := start(t, fixtureOpts{options: func(o *Options) {
		o.TLSAddr = "127.0.0.1:0"
		o.TLS = serverTLS(t, ca, true)
		o.Auth = Auth{Certificates: true, CertField: auth.CertCN, ACL: defaultACL(t)}
	}})
	tlsAddr := f.srv.TLSAddr().String()
	good := ca.Issue(t, "cert-dev", nil, false)

	conn, err := dialTLS(t, tlsAddr, clientTLS(ca, good))
	if err != nil {
		t.Fatal(err)
	}
	dev := mustConnect5(t, conn, login{id: "cert-dev"}, nil)
	if a, err := dev.publish(t, "devices/cert-dev/t", "x", 1); err != nil || a.code != 0 {
		t.Fatalf("publish under own prefix: 0x%02x %v", a.code, err)
	}
	if a, _ := dev.publish(t, "devices/other/t", "x", 1); a.code != packets.ErrNotAuthorized.Code {
		t.Fatalf("publish under another prefix: 0x%02x, want 0x87", a.code)
	}
	if d := f.table.PeekAt("cert-dev", generous, f.clock.Now()); d.Count != 1 {
		t.Errorf("cert-dev's window does not hold its one admitted message")
	}

	conn, err = dialTLS(t, tlsAddr, clientTLS(ca, good))
	if err != nil {
		t.Fatal(err)
	}
	if reason := refusedWith(t, conn, login{id: "someone-else"}, 0x85); !strings.Contains(reason, "cert-dev") {
		t.Errorf("reason %q does not name the certificate's identity", reason)
	}

	for name, cfg := range map[string]*tls.Config{
		"certificate from another CA": clientTLS(ca, other.Issue(t, "cert-dev", nil, false)),
		"no certificate":              clientTLS(ca),
	} {
		conn, err := dialTLS(t, tlsAddr, cfg)
		if err == nil {
			_, _, err = connect5(t, conn, login{id: "cert-dev"}, nil)
		}
		if err == nil {
			t.Errorf("%s: connected", name)
		}
	}
	if reason := refusedWith(t, dialTCP(t, f.addr), login{id: "cert-dev"}, 0x87); !strings.Contains(reason, "certificate") {
		t.Errorf("plain TCP: reason %q", reason)
	}
}

// TestAuthCertificateSAN takes the identity from the DNS SAN and lets
// password accounts in beside certificates.
func TestAuthCertificateSAN(t *testing.T) {
	ca := newCA(t, "fleet CA")
	f := start(t, fixtureOpts{options: func(o *Options) {
		o.TLSAddr = "127.0.0.1:0"
		o.TLS = serverTLS(t, ca, false)
		o.Auth = Auth{Certificates: true, CertField: auth.CertDNS, Credentials: credentials(t), ACL: defaultACL(t)}
	}})
	conn, err := dialTLS(t, f.srv.TLSAddr().String(), clientTLS(ca, ca.Issue(t, "ignored-cn", []string{"san-dev"}, false)))
	if err != nil {
		t.Fatal(err)
	}
	mustConnect5(t, conn, login{id: "san-dev"}, nil)
	// Without a certificate, the TLS listener takes passwords.
	conn, err = dialTLS(t, f.srv.TLSAddr().String(), clientTLS(ca))
	if err != nil {
		t.Fatal(err)
	}
	mustConnect5(t, conn, login{"dev-2", "dev-2", "dev-2-pw"}, nil)
	refusedWith(t, dialTCP(t, f.addr), login{"dev-2", "dev-2", "wrong"}, 0x86)
}

// TestAllowAllAnyTopic: without auth any client publishes and
// subscribes anywhere.
func TestAllowAllAnyTopic(t *testing.T) {
	f := start(t, fixtureOpts{})
	c := mustConnect5(t, dialTCP(t, f.addr), login{id: "anyone"}, nil)
	if code := c.subscribe(t, "#"); code != 1 {
		t.Fatalf("subscribe #: 0x%02x", code)
	}
	if a, err := c.publish(t, "devices/someone-else/x", "p", 1); err != nil || a.code != 0 {
		t.Fatalf("publish: 0x%02x %v", a.code, err)
	}
}

// TestWebSocket connects an MQTT 5 client over WebSocket.
func TestWebSocket(t *testing.T) {
	f := start(t, fixtureOpts{options: func(o *Options) {
		o.TCPAddr = ""
		o.WebSocketAddr = "127.0.0.1:0"
		o.Auth = Auth{Credentials: credentials(t), ACL: defaultACL(t)}
	}})
	if f.srv.Addr() != nil {
		t.Fatal("TCP listener bound without TCPAddr")
	}
	ws := f.srv.WebSocketAddr().String()
	refusedWith(t, dialWS(t, ws), login{"dev-1", "dev-1", "bad"}, 0x86)
	dev := mustConnect5(t, dialWS(t, ws), login{"dev-1", "dev-1", "dev-1-pw"}, nil)
	if a, err := dev.publish(t, "devices/dev-1/t", strings.Repeat("x", 10000), 1); err != nil || a.code != 0 {
		t.Fatalf("publish over WebSocket: 0x%02x %v", a.code, err)
	}
}

// TestACLCheckAllocs: the ACL check runs on every publish and every
// delivery; it allocates nothing.
func TestACLCheckAllocs(t *testing.T) {
	f := start(t, fixtureOpts{options: func(o *Options) {
		o.Auth = Auth{Credentials: credentials(t), ACL: defaultACL(t)}
	}})
	cl := f.srv.mqtt.NewClient(nil, "test", "dev-1", true)
	f.srv.auth.conns.setSession(cl, &session{device: "dev-1", role: auth.RoleDevice})
	if !f.srv.auth.OnACLCheck(cl, "devices/dev-1/a/b", true) || f.srv.auth.OnACLCheck(cl, "devices/dev-2/a", true) {
		t.Fatal("ACL check answers wrong")
	}
	if n := testing.AllocsPerRun(1000, func() {
		f.srv.auth.OnACLCheck(cl, "devices/dev-1/a/b", true)
		f.srv.auth.OnACLCheck(cl, "devices/dev-1/cmd/x", false)
	}); n != 0 {
		t.Errorf("OnACLCheck allocates %v times per call pair", n)
	}
}

// TestWebSocketTLSCertificates: over wss a client certificate
// authenticates as on the TLS listener.
func TestWebSocketTLSCertificates(t *testing.T) {
	ca := newCA(t, "fleet CA")
	f := start(t, fixtureOpts{options: func(o *Options) {
		o.TCPAddr = ""
		o.WebSocketAddr, o.WebSocketTLS = "127.0.0.1:0", true
		o.TLS = serverTLS(t, ca, true)
		o.Auth = Auth{Certificates: true, CertField: auth.CertCN, ACL: defaultACL(t)}
	}})
	addr := f.srv.WebSocketAddr().String()
	conn, err := dialWSS(t, addr, clientTLS(ca, ca.Issue(t, "wss-dev", nil, false)))
	if err != nil {
		t.Fatal(err)
	}
	dev := mustConnect5(t, conn, login{id: "wss-dev"}, nil)
	if a, err := dev.publish(t, "devices/wss-dev/t", "x", 1); err != nil || a.code != 0 {
		t.Fatalf("publish over wss: 0x%02x %v", a.code, err)
	}
	if _, err := dialWSS(t, addr, clientTLS(ca)); err == nil {
		t.Fatal("wss without a client certificate connected")
	}
}

// TestSetCredentials: new accounts authenticate after SetCredentials;
// a connected client stays connected.
func TestSetCredentials(t *testing.T) {
	entries, err := testEntries()
	if err != nil {
		t.Fatal(err)
	}
	only := func(names ...string) *auth.Credentials {
		var es []auth.Entry
		for _, e := range entries {
			if slices.Contains(names, e.Username) {
				es = append(es, e)
			}
		}
		c, err := auth.New(es)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	f := start(t, fixtureOpts{options: func(o *Options) {
		o.Auth = Auth{Credentials: only("dev-1"), ACL: defaultACL(t)}
	}})
	dev1 := mustConnect5(t, dialTCP(t, f.addr), login{"dev-1", "dev-1", "dev-1-pw"}, nil)
	refusedWith(t, dialTCP(t, f.addr), login{"dev-2", "dev-2", "dev-2-pw"}, 0x86)
	if err := f.srv.SetCredentials(only("dev-2")); err != nil {
		t.Fatal(err)
	}
	mustConnect5(t, dialTCP(t, f.addr), login{"dev-2", "dev-2", "dev-2-pw"}, nil)
	refusedWith(t, dialTCP(t, f.addr), login{"dev-1b", "dev-1", "dev-1-pw"}, 0x86)
	if a, err := dev1.publish(t, "devices/dev-1/t", "still here", 1); err != nil || a.code != 0 {
		t.Fatalf("connected dev-1 after the change: 0x%02x %v", a.code, err)
	}
	allowAll := start(t, fixtureOpts{})
	if err := allowAll.srv.SetCredentials(only("dev-1")); err == nil {
		t.Fatal("SetCredentials on an allow-all server succeeded")
	}
}

// TestAuthSweep: sweep forgets the sessions of closed clients (mochi
// skips OnDisconnect when a CONNACK write fails) and the rate windows
// of quiet addresses.
func TestAuthSweep(t *testing.T) {
	f := start(t, fixtureOpts{options: func(o *Options) {
		o.Auth = Auth{Credentials: credentials(t), ACL: defaultACL(t)}
		o.Limits = Limits{ConnectRate: devicelimit.Quota{Limit: 10, Window: time.Second}}
	}})
	live := mustConnect5(t, dialTCP(t, f.addr), login{"dev-1", "dev-1", "dev-1-pw"}, nil)
	dead := f.srv.mqtt.NewClient(nil, "test", "dev-2", true)
	f.srv.auth.conns.setSession(dead, &session{device: "dev-2"})
	dead.Stop(errors.New("test"))
	sessions := f.srv.auth.conns.len
	if n := sessions(); n != 2 {
		t.Fatalf("%d sessions before the sweep, want 2", n)
	}
	f.srv.tick(f.clock.Now())
	if n := sessions(); n != 1 {
		t.Fatalf("%d sessions after the sweep, want 1 (the live client)", n)
	}
	if f.srv.auth.rate.Len() != 1 {
		t.Fatalf("rate table holds %d addresses, want 1", f.srv.auth.rate.Len())
	}
	f.srv.tick(f.clock.Advance(2 * time.Second))
	if f.srv.auth.rate.Len() != 0 {
		t.Fatalf("rate table holds %d addresses after the window, want 0", f.srv.auth.rate.Len())
	}
	if a, err := live.publish(t, "devices/dev-1/t", "x", 1); err != nil || a.code != 0 {
		t.Fatalf("live client after the sweeps: 0x%02x %v", a.code, err)
	}
}

// TestACLMQTT311: MQTT 3.1.1 cannot be told no to a publish: one
// outside the prefix ends the connection, uncounted; a refused
// subscription gets SUBACK 0x80.
func TestACLMQTT311(t *testing.T) {
	f := start(t, fixtureOpts{options: func(o *Options) {
		o.Auth = Auth{Credentials: credentials(t), ACL: defaultACL(t)}
	}})
	c, err := f.dial3(t, "dev-1", "dev-1", "dev-1-pw")
	if err != nil {
		t.Fatal(err)
	}
	tok := c.Subscribe("devices/dev-2/cmd/#", 1, nil)
	if !tok.WaitTimeout(waitTimeout) {
		t.Fatal("no SUBACK")
	}
	if got := tok.(*mqtt3.SubscribeToken).Result()["devices/dev-2/cmd/#"]; got != 0x80 {
		t.Errorf("SUBACK 0x%02x, want 0x80", got)
	}
	if tok := c.Publish("devices/dev-1/t", 1, false, "ok"); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		t.Fatalf("publish under the prefix: %v", tok.Error())
	}
	c.Publish("devices/dev-2/t", 1, false, "forged")
	eventually(t, "connection closed", func() bool { return !c.IsConnected() })
	if st := f.srv.AuthStats(); st.PublishDenied != 1 || st.SubscribeDenied != 1 {
		t.Errorf("denied: %+v", st)
	}
	if st := f.srv.Stats(); st.Allowed != 1 || st.Dropped != 0 {
		t.Errorf("throttle saw %+v, want only the one allowed publish", st)
	}
}
