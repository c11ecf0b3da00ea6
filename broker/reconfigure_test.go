package broker

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/auth"
	"github.com/devicegate/devicegate/devicelimit"
)

// TestSetACL: after SetACL a connected device's next publish to a topic
// the new ACL denies is refused (0x87) while the connection stays, a
// topic it newly allows is admitted, and a subscription it no longer
// allows delivers nothing more. A zero ACL is refused while
// authentication is on.
func TestSetACL(t *testing.T) {
	f := start(t, fixtureOpts{options: func(o *Options) {
		o.Auth = Auth{Credentials: credentials(t), ACL: defaultACL(t)}
	}})
	dev := mustConnect5(t, dialTCP(t, f.addr), login{"dev-1", "dev-1", "dev-1-pw"}, nil)
	got := new(sink)
	sub := mustConnect5(t, dialTCP(t, f.addr), login{"dev-2", "dev-2", "dev-2-pw"}, func(p *paho.Publish) { got.add(string(p.Payload)) })
	if code := sub.subscribe(t, "devices/dev-2/cmd/#"); code != 1 {
		t.Fatalf("subscribe: 0x%02x", code)
	}
	if a, err := dev.publish(t, "devices/dev-1/secret", "before", 1); err != nil || a.code != 0 {
		t.Fatalf("publish before the change: 0x%02x %v", a.code, err)
	}
	if err := f.srv.Publish("devices/dev-2/cmd/a", []byte("cmd-a"), false, 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "cmd-a delivered", func() bool { return got.has("cmd-a") })
	acl, err := auth.NewACL("devices/{device}/public/#", "devices/{device}/cmd/x/#")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.srv.SetACL(acl); err != nil {
		t.Fatal(err)
	}
	if a, err := dev.publish(t, "devices/dev-1/secret", "after", 1); err != nil || a.code != packets.ErrNotAuthorized.Code {
		t.Fatalf("publish the new ACL denies: 0x%02x %v, want 0x87", a.code, err)
	}
	if a, err := dev.publish(t, "devices/dev-1/public/t", "ok", 1); err != nil || a.code != 0 {
		t.Fatalf("publish the new ACL allows: 0x%02x %v", a.code, err)
	}
	// Delivered in the order published: once the marker is in, cmd-b
	// would be too.
	for _, m := range [][2]string{{"devices/dev-2/cmd/b", "cmd-b"}, {"devices/dev-2/cmd/x/c", "marker"}} {
		if err := f.srv.Publish(m[0], []byte(m[1]), false, 1); err != nil {
			t.Fatal(err)
		}
	}
	if before := got.waitMarker(t, "marker"); strings.Join(before, ",") != "cmd-a" {
		t.Fatalf("delivered before the marker: %v, want cmd-a alone (cmd/b is outside the new subscribe template)", before)
	}
	select {
	case <-dev.lost():
		t.Fatal("the device lost its connection")
	default:
	}
	if err := f.srv.SetACL(auth.ACL{}); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("SetACL of a zero ACL with authentication on: %v", err)
	}
}

// TestSetLimits: SetLimits puts a connection rate in force for the next
// connections (none before), a lowered bound of silent connections for
// the next one accepted, and new consumer globs for the next CONNECT;
// a limit that needs a new server is refused by name, and so is a rate
// New would refuse, changing nothing.
func TestSetLimits(t *testing.T) {
	f := start(t, fixtureOpts{})
	for i := range 3 {
		mustConnect5(t, dialTCP(t, f.addr), login{id: fmt.Sprint("a", i)}, nil)
	}
	l := Limits{ConnectRate: devicelimit.Quota{Limit: 1, Window: time.Second}, ConnectRateExempt: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		MaxPendingPerAddress: 2, Consumers: []string{"backend-*"}}
	if err := f.srv.SetLimits(l); err != nil {
		t.Fatal(err)
	}
	mustConnect5(t, dialTCP(t, f.addr), login{id: "backend-1"}, nil)
	if _, _, err := connect5(t, dialTCP(t, f.addr), login{id: "b"}, nil); err == nil {
		t.Fatal("2nd connection within the new rate's window connected")
	}
	st := f.srv.AuthStats()
	if st.ConnectsRefused["rate"] != 1 || st.ConsumersSpooled != 1 {
		t.Fatalf("rate refusals %d, consumers spooled %d; want 1 and 1", st.ConnectsRefused["rate"], st.ConsumersSpooled)
	}
	if most, per := f.srv.auth.pending.bounds(); most != DefaultMaxPendingConnections || per != 2 {
		t.Fatalf("pending bounds %d, %d; want %d, 2", most, per, DefaultMaxPendingConnections)
	}

	bad := l
	bad.MaxConnections, bad.MaxInflight = 5, 7
	if err := f.srv.SetLimits(bad); !errors.Is(err, ErrInvalidOptions) || !strings.Contains(fmt.Sprint(err), "MaxConnections, MaxInflight cannot change") {
		t.Fatalf("SetLimits changing MaxConnections and MaxInflight: %v", err)
	}
	bad = Limits{ConnectRate: devicelimit.Quota{Limit: 5, Window: time.Millisecond}}
	if err := f.srv.SetLimits(bad); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("SetLimits with a window shorter than its buckets: %v", err)
	}
	if cr := f.srv.auth.connect.Load(); cr.quota.Limit != 1 {
		t.Fatalf("a refused SetLimits changed the rate to %v", cr.quota)
	}
	f.clock.Advance(1100 * time.Millisecond)
	if err := f.srv.SetLimits(Limits{}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		mustConnect5(t, dialTCP(t, f.addr), login{id: fmt.Sprint("c", i)}, nil)
	}
}
