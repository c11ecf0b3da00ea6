package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/forward"
	"github.com/devicegate/devicegate/internal/logtest"
	"github.com/devicegate/devicegate/internal/mosquittotest"
)

// connectAs connects an MQTT 5 client to g as username with password
// (client ID the username); the test's end disconnects it.
func connectAs(t *testing.T, g *Gateway, username, password string) (*paho.Client, error) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", g.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: conn})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: username, CleanStart: true, KeepAlive: 30,
		Username: username, UsernameFlag: true, Password: []byte(password), PasswordFlag: true}); err != nil {
		conn.Close()
		return nil, err
	}
	t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}) })
	return c, nil
}

// publishCode publishes at QoS 1 and returns the PUBACK's reason code.
func publishCode(t *testing.T, c *paho.Client, topic string) byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte("x")})
	if resp == nil {
		t.Fatalf("publish %s: %v", topic, err)
	}
	return resp.ReasonCode
}

// TestReloadAccessAndConnectLimits: a reload changes the topic ACL (a
// connected device's next publish outside the new template is refused,
// its connection kept), the connection rate (off for loopback before,
// one a minute after), the consumers (the next CONNECT of a matching
// client gets a spool) and the bounds of silent connections; the log
// line names each changed key.
func TestReloadAccessAndConnectLimits(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds")
	for _, u := range []string{"dev-1", "dev-2", "dev-3"} {
		if err := putAccount(creds, u, u+"-pw"); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testConfig(filepath.Join(dir, "data"), 100, time.Hour)
	cfg.Auth.CredentialsFile = creds
	logs := new(logtest.Capture)
	g := mustStart(t, cfg, Deps{Logger: slog.New(logs)})
	dev1, err := connectAs(t, g, "dev-1", "dev-1-pw")
	if err != nil {
		t.Fatal(err)
	}
	if code := publishCode(t, dev1, "devices/dev-1/t"); code != 0 {
		t.Fatalf("publish before the reload: 0x%02x", code)
	}

	next := cfg
	next.Auth.ACL.Publish = "devices/{device}/up/#"
	next.MQTT.ConnectRate = config.Rate{Limit: 1, Window: config.Duration(time.Minute), Exempt: []string{}}
	next.MQTT.Consumers.ClientIDs = []string{"dev-2"}
	next.MQTT.MaxPendingPerAddress = 7
	if err := next.Validate(); err != nil {
		t.Fatal(err)
	}
	changes, err := g.Reload(next)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, c := range changes {
		keys = append(keys, c.Key)
	}
	want := "auth.acl.publish mqtt.connect_rate.exempt[0] mqtt.connect_rate.exempt[1] mqtt.connect_rate.limit mqtt.connect_rate.window mqtt.consumers.client_ids[0] mqtt.max_pending_per_address"
	if strings.Join(keys, " ") != want {
		t.Fatalf("changes %v, want %s", keys, want)
	}
	if rec := logs.Find("configuration reloaded"); rec == nil || !strings.Contains(rec["changed"], `auth.acl.publish: "devices/{device}/#" -> "devices/{device}/up/#"`) {
		t.Fatalf("reload log line: %v", rec)
	}

	if code := publishCode(t, dev1, "devices/dev-1/t"); code != 0x87 {
		t.Fatalf("publish outside the new ACL: 0x%02x, want 0x87", code)
	}
	if code := publishCode(t, dev1, "devices/dev-1/up/t"); code != 0 {
		t.Fatalf("publish inside the new ACL: 0x%02x, want 0", code)
	}
	if _, err := connectAs(t, g, "dev-2", "dev-2-pw"); err != nil {
		t.Fatalf("the first connection under the new rate: %v", err)
	}
	if _, err := connectAs(t, g, "dev-3", "dev-3-pw"); err == nil {
		t.Fatal("a second connection within the new rate's minute connected")
	}
	st := g.srv.AuthStats()
	if st.ConsumersSpooled != 1 || st.ConnectsRefused["rate"] != 1 {
		t.Fatalf("consumers spooled %d, rate refusals %d; want 1 and 1", st.ConsumersSpooled, st.ConnectsRefused["rate"])
	}
	if code := publishCode(t, dev1, "devices/dev-1/up/t"); code != 0 {
		t.Fatalf("dev-1 after the reload: 0x%02x (connection lost?)", code)
	}
}

// TestReloadForwardLive: a reload puts a destination's new rate,
// max_age and max_bytes in force on each of its connections, and reads
// its password file again (also when only the file's content changed):
// the next connection's dialer carries the new password. A password
// file that cannot be read fails the reload, changing nothing; a
// changed address is refused naming the key.
func TestReloadForwardLive(t *testing.T) {
	up := mosquittotest.Start(t)
	dir := t.TempDir()
	pass := filepath.Join(dir, "pass")
	if err := os.WriteFile(pass, []byte("old-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(filepath.Join(dir, "data"), 1000, time.Hour)
	cfg.Forward = []config.Forward{{Name: "cloud", To: "mqtt://" + up.Addr, Topics: []string{"devices/#"}, MaxQoS: 1, Connections: 2,
		Username: "gw", PasswordFile: pass}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := mustStart(t, cfg, Deps{})
	conns := g.forward.Routes()[0].Conns
	password := func(f *forward.Forwarder) string { return f.Live().Dial.(*forward.MQTT).Password }
	if len(conns) != 2 || password(conns[0]) != "old-pw" {
		t.Fatalf("%d connections, password %q", len(conns), password(conns[0]))
	}

	next := cfg
	next.Forward = []config.Forward{cfg.Forward[0]}
	rate := 50.0
	next.Forward[0].Rate, next.Forward[0].MaxAge, next.Forward[0].MaxBytes = &rate, config.Duration(time.Minute), 1<<20
	if err := next.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pass, []byte("new-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Reload(next); err != nil {
		t.Fatal(err)
	}
	for i, f := range conns {
		l := f.Live()
		if l.Rate != 50 || l.MaxAge != time.Minute || l.MaxBytes != 1<<20 || password(f) != "new-pw" {
			t.Fatalf("connection %d after the reload: %+v, password %q", i, l, password(f))
		}
		if id := l.Dial.(*forward.MQTT).ClientID; !strings.HasSuffix(id, "-cloud-"+string(rune('0'+i))) {
			t.Fatalf("connection %d's client ID %q after the reload", i, id)
		}
	}

	bad := next
	bad.Forward = []config.Forward{next.Forward[0]}
	bad.Forward[0].PasswordFile = filepath.Join(dir, "missing")
	bad.Forward[0].MaxBytes = 5
	if _, err := g.Reload(bad); !errors.Is(err, ErrReloadInvalid) || !strings.Contains(err.Error(), "forward[0].password_file") {
		t.Fatalf("reload with a missing password file: %v", err)
	}
	bad.Forward[0].PasswordFile = pass
	bad.Forward[0].To = "mqtt://127.0.0.1:1"
	if _, err := g.Reload(bad); !errors.Is(err, ErrReloadRefused) || !strings.Contains(err.Error(), "forward[0].to: cannot change without a restart") {
		t.Fatalf("reload with another address: %v", err)
	}
	if l := conns[0].Live(); l.MaxBytes != 1<<20 || password(conns[0]) != "new-pw" {
		t.Fatalf("a failed reload changed the forwarder: %+v", l)
	}
}
