package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/config"
)

// TestCheckProcess: `gateway check` passes a good file without binding
// its ports (both are held by the test) or creating its data directory,
// and fails a bad one listing every problem with key and value, exit 1.
func TestCheckProcess(t *testing.T) {
	mqtt, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mqtt.Close()
	admin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	dataDir := filepath.Join(t.TempDir(), "never")
	good := writeConfig(t, fmt.Sprintf(`
mqtt: {tcp: %q}
admin: {addr: %q, token: "s3cret-token-0123456789"}
data_dir: %q
limits:
  default: {limit: 5, window: 1s}
  rules:
    - match: {client_id: "sensor-*"}
      quota: {limit: 2}
log: {format: json}
`, mqtt.Addr(), admin.Addr(), dataDir))
	code, stdout, stderr := runBinary(t, "check", "--config", good)
	if code != 0 || stdout != fmt.Sprintf("config %s: ok\n", good) || stderr != "" {
		t.Fatalf("check good: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Fatalf("check touched the data directory: %v", err)
	}

	// --print: every key with its default, in a form that parses back
	// to the same configuration (the secret aside).
	code, stdout, stderr = runBinary(t, "check", "--config", good, "--print")
	if code != 0 || stderr != "" {
		t.Fatalf("check --print: exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{"max_inflight: 8192", "format: json", "level: info", "token: " + config.Redacted, "limit: 2\n        window: 1s"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("--print lacks %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "s3cret") {
		t.Errorf("--print shows the admin token:\n%s", stdout)
	}
	printed, err := config.Parse(strings.NewReader(stdout))
	if err != nil {
		t.Fatalf("--print's output does not parse: %v\n%s", err, stdout)
	}
	want, err := serveConfig([]string{"--config", good}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want.Admin.Token = config.Redacted
	if !reflect.DeepEqual(printed, want) {
		t.Errorf("--print parses to\n%+v\nwant\n%+v", printed, want)
	}

	bad := writeConfig(t, fmt.Sprintf(`
mqtt: {tcp: %q}
data_dir: %q
limits:
  default: {limit: 0, window: 1s, policy: bounce}
log: {format: xml, level: loud}
`, mqtt.Addr(), dataDir))
	code, stdout, stderr = runBinary(t, "check", "--config", bad)
	if code != 1 || stdout != "" {
		t.Fatalf("check bad: exit %d, stdout %q, stderr %q; want 1 and nothing on stdout", code, stdout, stderr)
	}
	for _, want := range []string{
		`limits.default.limit: must be between 1 and 1000000000 (got 0)`,
		`limits.default.policy: must be drop, defer or disconnect (got "bounce")`,
		`log.format: must be text or json (got "xml")`,
		`log.level: must be debug, info, warn or error (got "loud")`,
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}

	// Past Validate, the files serve reads before it binds: a TLS
	// certificate that is not there.
	tlsBad := writeConfig(t, fmt.Sprintf(`
mqtt:
  tcp: %q
  tls: {addr: "127.0.0.1:0", cert_file: /nonexistent/cert.pem, key_file: /nonexistent/key.pem}
data_dir: %q
`, mqtt.Addr(), dataDir))
	code, _, stderr = runBinary(t, "check", "--config", tlsBad)
	if code != 1 || !strings.Contains(stderr, "mqtt.tls: ") || !strings.Contains(stderr, "/nonexistent/cert.pem") {
		t.Fatalf("check with a missing certificate: exit %d, stderr %q; want 1 naming mqtt.tls and the file", code, stderr)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Fatalf("check touched the data directory: %v", err)
	}
	code, _, stderr = runBinary(t, "check")
	if code != 2 || !strings.Contains(stderr, "--config FILE is required") {
		t.Fatalf("check without --config: exit %d, stderr %q", code, stderr)
	}
}

// TestLogFormatJSONProcess: with log.format json every line the gateway
// writes is a JSON object, the start-up lines with their keys.
func TestLogFormatJSONProcess(t *testing.T) {
	cfg := writeConfig(t, "log: {format: json}\n")
	p := start(t, "--config", cfg, "--data-dir", t.TempDir(), "--mqtt-addr", "127.0.0.1:0")
	m := p.waitLine(regexp.MustCompile(`^\{.*"msg":"mqtt listening".*\}$`), 10*time.Second)
	var line map[string]any
	if err := json.Unmarshal([]byte(m[0]), &line); err != nil || line["addr"] == nil || line["level"] != "INFO" || line["time"] == nil {
		t.Fatalf("line %q: %v; want time, level, msg and addr", m[0], err)
	}
	p.stop()
	for _, l := range strings.Split(p.stderr(), "\n") {
		if !json.Valid([]byte(l)) {
			t.Errorf("not a JSON line: %q", l)
		}
	}
}
