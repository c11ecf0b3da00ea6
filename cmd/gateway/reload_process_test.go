package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/freeport"
	"github.com/devicegate/devicegate/internal/testcert"
)

// reloadConfig is the file of the reload tests: MQTT on tcp and over
// TLS with the certificate pair name, a rule with a class, a rule with
// a group, log level level; ruleLimit, classLimit and groupCap are the
// rules' numbers, extra a rule more.
func reloadConfig(tcp, tlsAddr, cert, key, level string, ruleLimit, classLimit, groupCap int, extra string) string {
	return fmt.Sprintf(`mqtt:
  tcp: %q
  tls: {addr: %q, cert_file: %q, key_file: %q}
log: {level: %s}
persist: {snapshot_interval: 100ms}
limits:
  default: {limit: 1000, window: 1h}
  rules:
    - name: sensors
      match: {client_id: "sensor-*"}
      quota: {limit: %d, window: 1h}
      classes:
        - {name: alarms, topics: ["alarms/#"], quota: {limit: %d, window: 1h}}
    - name: tenants
      match: {client_id: "tenant-{tenant}-*"}
      quota: {limit: 100, window: 1h}
      group: {name: "{tenant}", quota: {limit: %d, window: 1h}}
%s`, tcp, tlsAddr, cert, key, level, ruleLimit, classLimit, groupCap, extra)
}

// reloadGW is a gateway of the reload tests, on the file it returns.
type reloadGW struct {
	*gw
	file, tls string
	certA     [2]string
}

func startReloadGW(t *testing.T) *reloadGW {
	t.Helper()
	dir := t.TempDir()
	ca := testcert.NewCA(t, "reload-ca")
	certA, keyA := testcert.WritePair(t, dir, "a", ca.Issue(t, "gateway-a", []string{"localhost"}, true))
	tcp, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	tlsAddr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(file, []byte(reloadConfig(tcp, tlsAddr, certA, keyA, "info", 5, 1, 4, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	p := start(t, "serve", "--config", file, "--data-dir", data)
	g := &gw{process: p, dir: data}
	g.mqtt = p.waitLine(listeningRE, 10*time.Second)[1]
	g.admin = p.waitLine(adminListeningRE, 10*time.Second)[1]
	b, err := os.ReadFile(filepath.Join(data, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	g.token = strings.TrimSpace(string(b))
	return &reloadGW{gw: g, file: file, tls: tlsAddr, certA: [2]string{certA, keyA}}
}

// servedCN returns the common name of the certificate a new TLS
// connection to addr is served.
func servedCN(t *testing.T, addr string) string {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("TLS dial %s: %v", addr, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
}

func (g *reloadGW) hangup(t *testing.T, re string) {
	t.Helper()
	if err := g.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	g.waitLine(regexp.MustCompile(re), 10*time.Second)
}

// TestReloadProcess: a rule's quota, a class, a group's cap, the log
// level and the TLS certificate change in the file; SIGHUP. The next
// message of a device connected before is judged by the new quota (its
// window keeping what it counted), the class and the group's cap by
// theirs, a new TLS connection gets the new certificate, debug lines
// appear, the rules listing has the new rule; none of 50 connected
// devices is disconnected, and the reload is counted.
func TestReloadProcess(t *testing.T) {
	g := startReloadGW(t)
	defer g.stop()
	var fleet []*client5
	for i := range 50 {
		fleet = append(fleet, dial5(t, g.mqtt, fmt.Sprintf("dev-%d", i)))
	}
	sensor := dial5(t, g.mqtt, "sensor-1")
	tenant := dial5(t, g.mqtt, "tenant-acme-1")
	for i := range 3 {
		sensor.mustPublish(t, "devices/sensor-1/t", fmt.Sprint(i), 0)
	}
	sensor.mustPublish(t, "alarms/fire", "a", 0)
	sensor.mustPublish(t, "alarms/fire", "a", 0x97) // the class's 1 per hour
	tenant.mustPublish(t, "tenants/acme", "1", 0)
	tenant.mustPublish(t, "tenants/acme", "2", 0)
	if cn := servedCN(t, g.tls); cn != "gateway-a" {
		t.Fatalf("served %q before the reload", cn)
	}

	ca := testcert.NewCA(t, "reload-ca-2")
	certB, keyB := testcert.WritePair(t, t.TempDir(), "b", ca.Issue(t, "gateway-b", []string{"localhost"}, true))
	extra := "    - name: extra\n      match: {client_id: \"extra-*\"}\n      quota: {limit: 1, window: 1h}\n"
	if err := os.WriteFile(g.file, []byte(reloadConfig(g.mqtt, g.tls, certB, keyB, "debug", 3, 2, 2, extra)), 0o600); err != nil {
		t.Fatal(err)
	}
	g.hangup(t, `msg="configuration reloaded" changes=\d+ connections=52 changed=.*limits.rules\[sensors\].quota.limit: \\"5\\" -> \\"3\\"`)

	// The window keeps its 3: the new quota of 3 refuses the 4th, which
	// the old one of 5 admitted.
	sensor.mustPublish(t, "devices/sensor-1/t", "4", 0x97)
	sensor.mustPublish(t, "alarms/fire", "a", 0)     // the class's new 2
	tenant.mustPublish(t, "tenants/acme", "3", 0x97) // the group's new cap of 2
	if cn := servedCN(t, g.tls); cn != "gateway-b" {
		t.Fatalf("a new TLS connection after the reload got %q, want gateway-b", cn)
	}
	g.waitLine(regexp.MustCompile(`level=DEBUG `), 10*time.Second)
	if code, body := g.call(t, "GET", "/api/v1/rules", ""); code != 200 || !strings.Contains(fmt.Sprint(body), "extra") {
		t.Fatalf("rules after the reload: %d %v", code, body)
	}
	if code, body := g.call(t, "GET", devicePath("sensor-1"), ""); code != 200 || fmt.Sprint(body["quota"].(map[string]any)["limit"]) != "3" {
		t.Fatalf("sensor-1 after the reload: %d %v", code, body)
	}
	lost := 0
	for _, c := range append(fleet, sensor, tenant) {
		select {
		case <-c.Lost():
			lost++
		default:
		}
	}
	if lost > 0 {
		t.Fatalf("%d devices lost their connection in the reload", lost)
	}
	for i, c := range fleet {
		c.mustPublish(t, fmt.Sprintf("devices/dev-%d/t", i), "after", 0)
	}
	samples, _ := g.scrape(t)
	if got := samples[`devicegate_config_reloads_total{result="ok"}`]; got != 1 {
		t.Fatalf("reloads counted ok: %v, want 1", got)
	}
}

// TestReloadRefusedProcess: a file that changes the MQTT listener's
// address is refused as a whole, naming the key and both values, by
// SIGHUP and by POST /api/v1/reload (409); the gateway serves on as
// before, with the old quota, and counts the refusals.
func TestReloadRefusedProcess(t *testing.T) {
	g := startReloadGW(t)
	defer g.stop()
	sensor := dial5(t, g.mqtt, "sensor-1")
	other, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(g.file, []byte(reloadConfig(other, g.tls, g.certA[0], g.certA[1], "info", 3, 1, 4, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	g.hangup(t, `msg="configuration not reloaded: it changes keys that need a restart; the running configuration stays" error="mqtt.tcp: cannot change without a restart \(running \\"`+regexp.QuoteMeta(g.mqtt)+`\\", file \\"`+regexp.QuoteMeta(other)+`\\"\)"`)
	code, body := g.call(t, "POST", "/api/v1/reload", "")
	if code != 409 || !strings.Contains(fmt.Sprint(body["error"]), "mqtt.tcp") || strings.Contains(fmt.Sprint(body["error"]), "limits.rules") {
		t.Fatalf("POST /api/v1/reload: %d %v; want 409 naming mqtt.tcp alone", code, body)
	}
	for i := range 5 { // the old quota of 5, not the file's 3
		sensor.mustPublish(t, "devices/sensor-1/t", fmt.Sprint(i), 0)
	}
	sensor.mustPublish(t, "devices/sensor-1/t", "6", 0x97)
	dial5(t, g.mqtt, "sensor-2").mustPublish(t, "devices/sensor-2/t", "x", 0)
	if _, err := net.DialTimeout("tcp", other, time.Second); err == nil {
		t.Fatalf("something listens on the refused address %s", other)
	}
	samples, _ := g.scrape(t)
	if got, ok := samples[`devicegate_config_reloads_total{result="refused"}`], samples[`devicegate_config_reloads_total{result="ok"}`]; got != 2 || ok != 0 {
		t.Fatalf("reloads counted refused %v, ok %v; want 2 and 0", got, ok)
	}
}

// TestReloadUnparsableProcess: a file that does not parse changes
// nothing, by SIGHUP and by gateway reload (exit 1, the line named);
// the gateway serves on.
func TestReloadUnparsableProcess(t *testing.T) {
	g := startReloadGW(t)
	defer g.stop()
	if err := os.WriteFile(g.file, []byte("limits:\n  default: {limit: 3, window: 1h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g.hangup(t, `msg="configuration not reloaded; the running configuration stays" error=.*line`)
	code, stdout, stderr := runBinary(t, "reload", "--admin-addr", g.admin, "--data-dir", g.dir)
	if code != 1 || stdout != "" || !strings.Contains(stderr, "configuration not reloaded") || !strings.Contains(stderr, "line") {
		t.Fatalf("gateway reload: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	c := dial5(t, g.mqtt, "dev-1")
	for i := range 5 {
		c.mustPublish(t, "devices/dev-1/t", fmt.Sprint(i), 0)
	}
	samples, _ := g.scrape(t)
	if got := samples[`devicegate_config_reloads_total{result="invalid"}`]; got != 2 {
		t.Fatalf("reloads counted invalid: %v, want 2", got)
	}
	// A good file again: gateway reload applies it and prints the change.
	if err := os.WriteFile(g.file, []byte(reloadConfig(g.mqtt, g.tls, g.certA[0], g.certA[1], "info", 4, 1, 4, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runBinary(t, "reload", "--admin-addr", g.admin, "--data-dir", g.dir)
	if code != 0 || !strings.Contains(stdout, `limits.rules[sensors].quota.limit: "5" -> "4"`) {
		t.Fatalf("gateway reload: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
