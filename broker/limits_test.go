package broker

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestLimitsAtConnect: a client ID over MaxClientIDLength is refused
// with 0x85, a new device beyond MaxDevices with 0x97 while known ones
// still connect, and an unbounded keepalive is set to KeepaliveMax.
func TestLimitsAtConnect(t *testing.T) {
	f := start(t, fixtureOpts{options: func(o *Options) {
		o.Limits = Limits{MaxClientIDLength: 16, MaxDevices: 2, KeepaliveMax: time.Minute, KeepaliveMin: 10 * time.Second}
	}})
	refusedWith(t, dialTCP(t, f.addr), login{id: strings.Repeat("x", 17)}, 0x85)
	for _, id := range []string{"d-1", "d-2"} {
		p := mustConnect5(t, dialTCP(t, f.addr), login{id: id}, nil)
		if a, err := p.publish(t, "t/"+id, "x", 1); err != nil || a.code != 0 {
			t.Fatalf("%s publish: 0x%02x %v", id, a.code, err)
		}
	}
	if reason := refusedWith(t, dialTCP(t, f.addr), login{id: "d-3"}, 0x97); !strings.Contains(reason, "maximum of 2 devices") {
		t.Errorf("reason %q", reason)
	}
	mustConnect5(t, dialTCP(t, f.addr), login{id: "d-1"}, nil) // known: has a window
	if got := f.srv.AuthStats().ConnectsRefused; got["devices"] != 1 || got["client_id"] != 1 {
		t.Errorf("refusals %v", got)
	}

	// paho asks for keepalive 30s: inside the bounds, left alone; 0
	// (none) and 5s are set to the bounds and announced.
	for _, tc := range []struct{ ask, want uint16 }{{0, 60}, {5, 10}, {30, 0}} {
		c := paho.NewClient(paho.ClientConfig{Conn: dialTCP(t, f.addr)})
		ctx, cancel := contextTimeout()
		ca, err := c.Connect(ctx, &paho.Connect{ClientID: "d-1", CleanStart: true, KeepAlive: tc.ask})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		var got uint16
		if ca.Properties != nil && ca.Properties.ServerKeepAlive != nil {
			got = *ca.Properties.ServerKeepAlive
		}
		if got != tc.want {
			t.Errorf("keepalive %d: server keep alive %d, want %d", tc.ask, got, tc.want)
		}
		_ = c.Disconnect(&paho.Disconnect{})
	}
}

// TestConnectRate: new connections from one address beyond the rate
// are closed before CONNECT is read, until the window moves on.
func TestConnectRate(t *testing.T) {
	f := start(t, fixtureOpts{options: func(o *Options) {
		o.Limits = Limits{ConnectRate: devicelimit.Quota{Limit: 3, Window: time.Second}}
	}})
	for i := range 3 {
		mustConnect5(t, dialTCP(t, f.addr), login{id: fmt.Sprint("r", i)}, nil)
	}
	if _, _, err := connect5(t, dialTCP(t, f.addr), login{id: "r"}, nil); err == nil {
		t.Fatal("4th connection within the window connected")
	}
	if got := f.srv.AuthStats().ConnectsRefused["rate"]; got != 1 {
		t.Errorf("rate refusals %d, want 1", got)
	}
	f.clock.Advance(1100 * time.Millisecond) // the window's RetryAfter: T plus one bucket
	mustConnect5(t, dialTCP(t, f.addr), login{id: "r"}, nil)
}

// TestConnectRateExempt: an exempt address is not counted.
func TestConnectRateExempt(t *testing.T) {
	f := start(t, fixtureOpts{options: func(o *Options) {
		o.Limits = Limits{ConnectRate: devicelimit.Quota{Limit: 1, Window: time.Second},
			ConnectRateExempt: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	}})
	for i := range 5 {
		mustConnect5(t, dialTCP(t, f.addr), login{id: fmt.Sprint("e", i)}, nil)
	}
	if got := f.srv.AuthStats().ConnectsRefused["rate"]; got != 0 {
		t.Errorf("rate refusals %d, want 0", got)
	}
}

// TestMaxPacketSize: a publish over the limit ends the connection; one
// under it passes.
func TestMaxPacketSize(t *testing.T) {
	f := start(t, fixtureOpts{options: func(o *Options) { o.Limits = Limits{MaxPacketSize: 1024} }})
	p := mustConnect5(t, dialTCP(t, f.addr), login{id: "big"}, nil)
	if a, err := p.publish(t, "t", strings.Repeat("x", 900), 1); err != nil || a.code != 0 {
		t.Fatalf("publish under the limit: 0x%02x %v", a.code, err)
	}
	p.send("t", strings.Repeat("x", 2000), 1)
	receive(t, "connection closed", p.lost())
}

// TestMaxConnections: beyond MaxConnections a client gets 0x89;
// MaxPendingWrites reaches mochi.
func TestMaxConnections(t *testing.T) {
	f := start(t, fixtureOpts{options: func(o *Options) { o.Limits = Limits{MaxConnections: 1, MaxPendingWrites: 16} }})
	mustConnect5(t, dialTCP(t, f.addr), login{id: "c-1"}, nil)
	refusedWith(t, dialTCP(t, f.addr), login{id: "c-2"}, 0x89)
	if got := f.srv.mqtt.Options.Capabilities.MaximumClientWritesPending; got != 16 {
		t.Errorf("mochi's pending writes %d, want MaxPendingWrites 16", got)
	}
}
