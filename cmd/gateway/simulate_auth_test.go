package main

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/devicegate/devicegate/auth"
	"github.com/devicegate/devicegate/internal/testcert"
)

// TestSimulateCredentialsProcess drives a gateway process with a
// credentials file made by gateway passwd (device account fleet for
// the client IDs dev-*, consumer account backend) and a TLS listener:
// over TCP with MQTT 5 and over TLS with MQTT 3.1.1 the runs pass with
// numbers that add up; with a wrong password every device is refused at
// CONNECT (MQTT 5 and 3.1.1) and the run fails saying so; with the device account the
// subscriber is refused its subscription and told to use a consumer.
func TestSimulateCredentialsProcess(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds")
	for _, args := range [][]string{
		{"--file", creds, "fleet", "--client-ids", "dev-*"},
		{"--file", creds, "backend", "--role", "consumer", "--client-ids", "sim-sub-*"},
	} {
		if err := passwd(args, strings.NewReader(args[2]+"-s3cret\n"), io.Discard); err != nil {
			t.Fatal(err)
		}
	}
	lowerBcryptCost(t, creds, map[string]string{"fleet": "fleet-s3cret", "backend": "backend-s3cret"})
	pwFile := func(name, pw string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	fleetPW, backendPW, wrongPW := pwFile("fleet.pw", "fleet-s3cret"), pwFile("backend.pw", "backend-s3cret"), pwFile("wrong.pw", "guess")
	certFile, keyFile, _ := testcert.SelfSigned(t, dir)
	cfgPath := writeConfig(t, "mqtt: {tcp: \"127.0.0.1:0\", tls: {addr: \"127.0.0.1:0\", cert_file: "+strconv.Quote(certFile)+
		", key_file: "+strconv.Quote(keyFile)+"}}\nauth: {credentials_file: "+strconv.Quote(creds)+"}\n")
	gw := start(t, "serve", "--config", cfgPath, "--data-dir", filepath.Join(dir, "data"), "--limit", "5", "--window", "1s")
	addr := gw.waitLine(listeningRE, 10*time.Second)[1]
	tlsAddr := gw.waitLine(regexp.MustCompile(`msg="mqtt tls listening" addr=(\S+)`), 10*time.Second)[1]

	type outcome struct {
		code           int
		stdout, stderr string
	}
	common := []string{"simulate", "--devices", "3", "--rate", "10/s", "--duration", "1500ms", "--limit", "5", "--window", "1s",
		"--tolerance", "100ms", "--username", "fleet", "--password-file", fleetPW}
	runs := map[string][]string{
		"tcp": {"--addr", addr, "--id-pattern", "dev-tcp-%d", "--sub-username", "backend", "--sub-password-file", backendPW,
			"--sub-client-id", "sim-sub-tcp", "--json", filepath.Join(dir, "tcp.json")},
		"tls": {"--addr", tlsAddr, "--tls-ca", certFile, "--protocol", "4", "--id-pattern", "dev-tls-%d",
			"--sub-username", "backend", "--sub-password-file", backendPW, "--sub-client-id", "sim-sub-tls", "--json", filepath.Join(dir, "tls.json")},
		// The last --password-file wins.
		"wrong": {"--addr", addr, "--id-pattern", "dev-bad-%d", "--password-file", wrongPW, "--sub-username", "backend",
			"--sub-password-file", backendPW, "--sub-client-id", "sim-sub-bad", "--json", filepath.Join(dir, "wrong.json")},
		"wrong4": {"--addr", addr, "--protocol", "4", "--id-pattern", "dev-bad4-%d", "--password-file", wrongPW, "--sub-username", "backend",
			"--sub-password-file", backendPW, "--sub-client-id", "sim-sub-bad4"},
		"device-sub": {"--addr", addr, "--id-pattern", "dev-ds-%d", "--sub-client-id", "dev-sub"},
	}
	out := make(map[string]*outcome)
	var wg sync.WaitGroup
	for name, args := range runs {
		o := new(outcome)
		out[name] = o
		wg.Go(func() { o.code, o.stdout, o.stderr = runBinary(t, append(slices.Clone(common), args...)...) })
	}
	wg.Wait()

	for _, name := range []string{"tcp", "tls"} {
		o := out[name]
		if o.code != 0 || !strings.Contains(o.stdout, "OK: 0 devices over quota") {
			t.Fatalf("%s: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", name, o.code, o.stdout, o.stderr)
		}
		jsonPath := filepath.Join(dir, name+".json")
		rep := readReport(t, jsonPath)
		checkAddsUp(t, rep)
		tot := rep.Result.Totals
		t.Logf("%s: totals %+v", name, tot)
		// 3 devices at 10/s for 1.5 s send 45 on a quiet machine; a run
		// beside the race-detector suite sent 29 once. A third of that
		// is plenty to show the connections worked.
		if tot.Devices != 3 || tot.Sent < 15 || tot.Violations != 0 || tot.Lost != 0 || rep.ConnectFailures != 0 || rep.RefusedAtConnect != 0 {
			t.Errorf("%s: totals %+v, connect failures %d", name, tot, rep.ConnectFailures)
		}
		if a := rep.Config.Auth; a.Username != "fleet" || a.SubUsername != "backend" || a.TLSOn != (name == "tls") {
			t.Errorf("%s: report's auth %+v", name, a)
		}
		if b, _ := os.ReadFile(jsonPath); strings.Contains(string(b), "s3cret") {
			t.Errorf("%s: a password is in the JSON report", name)
		}
	}
	// MQTT 5 acks carry the verdict: 10/s against 5/1s is refused.
	if tot := readReport(t, filepath.Join(dir, "tcp.json")).Result.Totals; tot.Refused == 0 || tot.Unacked != 0 {
		t.Errorf("tcp: totals %+v, want refusals and every message acked", tot)
	}

	o := out["wrong"]
	if o.code != 1 || !strings.Contains(o.stderr, "CONNACK 0x86 bad username or password") ||
		!strings.Contains(o.stderr, "the gateway refused 3 of 3 devices at CONNECT") {
		t.Errorf("wrong password: exit %d, want 1 and the refusal named\nstdout:\n%s\nstderr:\n%s", o.code, o.stdout, o.stderr)
	}
	if rep := readReport(t, filepath.Join(dir, "wrong.json")); rep.ConnectFailures != 3 || rep.RefusedAtConnect != 3 || rep.Result.Totals.Sent != 0 || rep.Verdict.OK {
		t.Errorf("wrong password: connect failures %d, refused %d, totals %+v, verdict %+v", rep.ConnectFailures, rep.RefusedAtConnect, rep.Result.Totals, rep.Verdict)
	}

	if o := out["wrong4"]; o.code != 1 || !strings.Contains(o.stderr, "CONNACK return code 4 bad user name or password") ||
		!strings.Contains(o.stderr, "the gateway refused 3 of 3 devices at CONNECT") {
		t.Errorf("wrong password, MQTT 3.1.1: exit %d\nstdout:\n%s\nstderr:\n%s", o.code, o.stdout, o.stderr)
	}

	o = out["device-sub"]
	if o.code != 1 || !strings.Contains(o.stderr, "SUBACK 0x87 not authorized") || !strings.Contains(o.stderr, "consumer account") {
		t.Errorf("subscriber with the device account: exit %d\nstdout:\n%s\nstderr:\n%s", o.code, o.stdout, o.stderr)
	}
	for name, o := range out {
		if strings.Contains(o.stdout+o.stderr, "s3cret") {
			t.Errorf("%s: a password in the output", name)
		}
	}
}

// lowerBcryptCost hashes again, at bcrypt's lowest cost, the passwords
// of the accounts gateway passwd wrote to creds (their roles and client
// IDs stay as it wrote them). At passwd's cost of 10, the runs' twenty
// concurrent CONNECTs (wrong passwords are never cached) took longer
// than a 1.5 s run on a loaded machine, and a device whose CONNECT is
// not answered by the run's end is neither refused nor failed: the
// wrong-password runs found 2 of 3, or none, refused.
func lowerBcryptCost(t *testing.T, creds string, passwords map[string]string) {
	t.Helper()
	f, err := os.Open(creds)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := auth.ParseFile(f)
	f.Close()
	if err != nil || len(entries) != len(passwords) {
		t.Fatalf("%s: %d entries, %v", creds, len(entries), err)
	}
	for _, e := range entries {
		h, err := bcrypt.GenerateFromPassword([]byte(passwords[e.Username]), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		e.Hash = string(h)
		if err := auth.Put(creds, e); err != nil {
			t.Fatal(err)
		}
	}
}
