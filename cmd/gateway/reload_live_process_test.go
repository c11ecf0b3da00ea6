package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/devicegate/devicegate/internal/freeport"
	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/mqtttest"
	"github.com/devicegate/devicegate/internal/poll"
)

// liveConfig is the file of TestReloadLiveProcess: accounts, an ACL
// publish template, the consumers' globs, and a forward destination
// with a password file, its rate and max_bytes lines (rate "" for
// none).
func liveConfig(tcp, creds, publish, consumers, up, pass, rate, maxBytes string) string {
	return fmt.Sprintf(`mqtt:
  tcp: %q
  consumers: {client_ids: [%s]}
auth:
  credentials_file: %q
  acl: {publish: %q}
persist: {snapshot_interval: 100ms}
limits:
  default: {limit: 1000, window: 1h}
forward:
  - name: cloud
    to: "mqtt://%s"
    topics: ["devices/#"]
    max_qos: 1
    username: gw
    password_file: %q
    max_backoff: 1s
    max_bytes: %s
%s`, tcp, consumers, creds, publish, up, pass, maxBytes, rate)
}

// TestReloadLiveProcess: with devices connected and the upstream
// (Mosquitto with a password file) down, the file changes the ACL's
// publish template, adds a consumer, sets a forward rate, lowers
// max_bytes, and the upstream's password changes in both Mosquitto's
// password file and the gateway's; SIGHUP. The forward log is trimmed
// to the new bound at once; a connected device's next publish to a
// topic newly denied is refused (0x87) and it stays connected; the
// consumer's next connection gets a spool; once the upstream is back,
// the gateway's next connection logs in with the new password and the
// backlog goes at the new rate. No device is disconnected and the
// reload is counted.
func TestReloadLiveProcess(t *testing.T) {
	up := mosquittotest.StartWith(t, mosquittotest.Options{Persist: true, Users: map[string]string{"gw": "pw-1", "backend": "backend-pw"}})
	var mu sync.Mutex
	arrived := map[string]time.Time{}
	back := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + up.Addr).SetClientID("backend").SetUsername("backend").SetPassword("backend-pw").
		SetCleanSession(false).SetAutoReconnect(true).SetMaxReconnectInterval(100 * time.Millisecond))
	if tok := back.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("upstream subscriber: %v", tok.Error())
	}
	t.Cleanup(func() { back.Disconnect(0) })
	if tok := back.Subscribe("devices/#", 1, func(_ mqtt.Client, m mqtt.Message) {
		mu.Lock()
		if _, seen := arrived[string(m.Payload())]; !seen {
			arrived[string(m.Payload())] = time.Now()
		}
		mu.Unlock()
	}); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe upstream: %v", tok.Error())
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(arrived) }

	dir := t.TempDir()
	creds := filepath.Join(dir, "creds")
	for _, a := range [][]string{{"dev-1"}, {"dev-2"}, {"dev-3"}, {"--role", "consumer", "backend-1"}} {
		user := a[len(a)-1]
		if err := passwd(append([]string{"--file", creds}, a...), strings.NewReader(user+"-pw\n"), new(strings.Builder)); err != nil {
			t.Fatal(err)
		}
	}
	pass := filepath.Join(dir, "upstream.pass")
	if err := os.WriteFile(pass, []byte("pw-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tcp, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "gateway.yaml")
	write := func(publish, consumers, rate, maxBytes string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(liveConfig(tcp, creds, publish, consumers, up.Addr, pass, rate, maxBytes)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("devices/{device}/#", "", "", "0")
	data := filepath.Join(dir, "data")
	p := start(t, "serve", "--config", file, "--data-dir", data)
	g := &gw{process: p, dir: data, mqtt: p.waitLine(listeningRE, 10*time.Second)[1], admin: p.waitLine(adminListeningRE, 10*time.Second)[1]}
	defer g.stop()
	b, err := os.ReadFile(filepath.Join(data, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	g.token = strings.TrimSpace(string(b))

	var devs []*mqtttest.Client5
	for _, id := range []string{"dev-1", "dev-2", "dev-3"} {
		devs = append(devs, mqtttest.DialLogin5(t, g.mqtt, id, id, id+"-pw"))
	}
	dev := devs[0]
	dev.MustPublish(t, "devices/dev-1/t", "first", codeSuccess)
	poll.Until(t, 20*time.Second, "the first message upstream (password pw-1)", func() bool { return count() == 1 })

	// The upstream goes down; 60 messages of 1 KiB wait in the log.
	up.Stop()
	payload := strings.Repeat("x", 1000)
	for i := range 60 {
		dev.MustPublish(t, "devices/dev-1/t", fmt.Sprintf("%02d%s", i, payload), codeSuccess)
	}
	poll.Until(t, 10*time.Second, "60 messages in the forward log", func() bool {
		s, _ := g.scrape(t)
		return s[`devicegate_forward_backlog_messages{upstream="cloud"}`] == 60
	})

	up.SetPassword("gw", "pw-2")
	if err := os.WriteFile(pass, []byte("pw-2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	write("devices/{device}/up/#", `"backend-*"`, "    rate: 20\n", "32KiB")
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	line := p.waitLine(regexp.MustCompile(`msg="configuration reloaded" changes=(\d+) .*forward_upstreams=1 changed="(.*)"`), 10*time.Second)
	for _, want := range []string{`auth.acl.publish: \"devices/{device}/#\" -> \"devices/{device}/up/#\"`, `forward[0].rate: \"(none)\" -> \"20\"`,
		`forward[0].max_bytes: \"`, `\" -> \"32KiB\"`, `mqtt.consumers.client_ids[0]: \"(none)\" -> \"backend-*\"`} {
		if !strings.Contains(line[2], want) {
			t.Errorf("reload line lacks %s:\n%s", want, line[0])
		}
	}

	// max_bytes: trimmed at once, the oldest dropped.
	var backlog float64
	poll.Until(t, 10*time.Second, "the forward log trimmed to 32KiB", func() bool {
		s, _ := g.scrape(t)
		backlog = s[`devicegate_forward_backlog_messages{upstream="cloud"}`]
		return s[`devicegate_forward_backlog_bytes{upstream="cloud"}`] <= 32<<10 && s[`devicegate_forward_dropped_total{reason="oldest",upstream="cloud"}`] > 0
	})
	// The ACL: the next publish outside the new template is refused, one
	// inside admitted, the connection kept.
	dev.MustPublish(t, "devices/dev-1/t", "denied", 0x87)
	dev.MustPublish(t, "devices/dev-1/up/t", "last", codeSuccess)
	// The consumer: its next connection gets a spool.
	mqtttest.DialLogin5(t, g.mqtt, "backend-1", "backend-1", "backend-1-pw")
	if s, _ := g.scrape(t); s["devicegate_consumers_spooled_total"] != 1 {
		t.Fatalf("consumers spooled %v, want 1", s["devicegate_consumers_spooled_total"])
	}

	// The upstream back with the new password: the next connection uses
	// it, and the backlog goes at 20 a second.
	up.Restart()
	want := int(backlog) + 2 // the backlog, "last", and "first" before
	poll.Until(t, 60*time.Second, fmt.Sprintf("%d messages upstream", want), func() bool { return count() == want })
	mu.Lock()
	var first, last time.Time
	for p, at := range arrived {
		if p == "first" {
			continue
		}
		if first.IsZero() || at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
	}
	_, denied := arrived["denied"]
	mu.Unlock()
	// At 20 a second they take about (want-1)/20 s; the upstream
	// subscriber's own reconnection may bunch the first few. Unpaced,
	// they take milliseconds.
	if spread, least := last.Sub(first), time.Duration(float64(want-1)/20/2*float64(time.Second)); spread < least {
		t.Fatalf("%d messages upstream over %s, want at least %s at the new rate", want-1, spread, least)
	}
	if denied {
		t.Fatal("the message the new ACL denied went upstream")
	}
	for i, d := range devs {
		select {
		case <-d.Lost():
			t.Fatalf("dev-%d lost its connection", i+1)
		default:
		}
	}
	if s, _ := g.scrape(t); s[`devicegate_config_reloads_total{result="ok"}`] != 1 {
		t.Fatalf("reloads counted ok: %v, want 1", s[`devicegate_config_reloads_total{result="ok"}`])
	}
	t.Logf("backlog after the trim %v; %d messages upstream over %s at rate 20", backlog, want-1, last.Sub(first).Round(time.Millisecond))
}
