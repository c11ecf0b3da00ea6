package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// TestPasswd: gateway passwd adds and replaces entries (flags before or
// after the username), and refuses bad input without touching the file.
func TestPasswd(t *testing.T) {
	file := filepath.Join(t.TempDir(), "creds")
	var out strings.Builder
	for _, args := range [][]string{
		{"--file", file, "dev-1"},
		{"--file", file, "fleet", "--client-ids", "fleet-*,gw-?", "--hash", "argon2id"},
		{"--role", "consumer", "--file", file, "backend"},
	} {
		if err := passwd(args, strings.NewReader("pw-"+args[len(args)-1]+"\n"), &out); err != nil {
			t.Fatalf("passwd %q: %v", args, err)
		}
	}
	before, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if s := string(before); !strings.Contains(s, ":device:fleet-*,gw-?\n") || !strings.Contains(s, ":consumer:\n") || strings.Contains(s, "pw-") {
		t.Fatalf("file:\n%s", s)
	}
	for _, tc := range []struct {
		args  []string
		stdin string
		want  string
	}{
		{[]string{"dev-1"}, "pw\n", "--file is required"},
		{[]string{"--file", file}, "pw\n", "want exactly one USERNAME"},
		{[]string{"--file", file, "a", "b"}, "pw\n", "want exactly one USERNAME"},
		{[]string{"--file", file, "dev-1"}, "\n", "empty password"},
		{[]string{"--file", file, "--role", "admin", "dev-1"}, "pw\n", "--role must be device or consumer"},
		{[]string{"--file", file, "--client-ids", "a\\", "dev-1"}, "pw\n", `client-ID pattern "a\\"`},
		{[]string{"--file", file, "--hash", "md5", "dev-1"}, "pw\n", "unknown hash algorithm"},
		{[]string{"--file", file, "dev 1"}, "pw\n", "white space"},
		// MQTT carries passwords of up to 65535 bytes; a longer one is
		// not cut to fit, which would store a hash no device can match.
		{[]string{"--file", file, "--hash", "argon2id", "dev-1"}, strings.Repeat("p", 65536) + "\n", "longer than 65535 bytes"},
		{[]string{"--file", file, "--hash", "argon2id", "dev-1"}, strings.Repeat("p", 70000), "longer than 65535 bytes"},
	} {
		err := passwd(tc.args, strings.NewReader(tc.stdin), &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("passwd %q: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	after, _ := os.ReadFile(file)
	if string(after) != string(before) {
		t.Fatal("a refused passwd changed the file")
	}
}

// TestGatewayCredentials starts the gateway with a credentials file
// made by gateway passwd and an admin API over TLS: a wrong password is
// refused, a publish outside the device's prefix gets 0x87, and both
// show in /metrics, read over HTTPS; neither password nor token is logged.
func TestGatewayCredentials(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds")
	if err := passwd([]string{"--file", creds, "dev-1"}, strings.NewReader("s3cret-pw\n"), new(strings.Builder)); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, pool := selfSigned(t, dir)
	cfg := testConfig(filepath.Join(dir, "data"), 100, time.Second)
	cfg.Auth.CredentialsFile = creds
	cfg.Admin.TLS.CertFile, cfg.Admin.TLS.KeyFile = certFile, keyFile
	cfg.Admin.Token = "admin-token-never-logged"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	logs := new(captureHandler)
	g := mustStart(t, cfg, deps{logger: slog.New(logs)})
	if rec := logs.find("authentication on"); rec == nil || rec["accounts"] != "1" {
		t.Errorf("start-up log: %v\n%s", rec, logs)
	}

	connect := func(password string) (*paho.Client, *paho.Connack, error) {
		conn, err := net.DialTimeout("tcp", g.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c := paho.NewClient(paho.ClientConfig{Conn: conn})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ca, err := c.Connect(ctx, &paho.Connect{ClientID: "dev-1", CleanStart: true, KeepAlive: 30,
			Username: "dev-1", UsernameFlag: true, Password: []byte(password), PasswordFlag: true})
		if err == nil {
			t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}) })
		}
		return c, ca, err
	}
	if _, ca, err := connect("wrong"); err == nil || ca == nil || ca.ReasonCode != 0x86 {
		t.Fatalf("wrong password: %v, connack %+v; want 0x86", err, ca)
	}
	c, _, err := connect("s3cret-pw")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Publish(ctx, &paho.Publish{Topic: "devices/dev-2/t", QoS: 1, Payload: []byte("x")})
	if resp == nil || resp.ReasonCode != 0x87 {
		t.Fatalf("publish outside the prefix: %+v %v; want 0x87", resp, err)
	}

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	r, err := client.Get("https://" + g.AdminAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body := new(strings.Builder)
	_, _ = io.Copy(body, r.Body)
	r.Body.Close()
	for _, want := range []string{`devicegate_acl_denied_total{action="publish"} 1`, `devicegate_connects_refused_total{reason="credentials"} 1`} {
		if !strings.Contains(body.String(), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if r, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + g.AdminAddr().String() + "/healthz"); err == nil {
		r.Body.Close()
		if r.StatusCode == http.StatusOK {
			t.Error("plain HTTP to the TLS admin API succeeded")
		}
	}
	old := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool,
		MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}}}
	if r, err := old.Get("https://" + g.AdminAddr().String() + "/healthz"); err == nil {
		r.Body.Close()
		t.Error("a TLS 1.1 client reached the admin API")
	}
	if s := logs.String(); strings.Contains(s, "s3cret-pw") || strings.Contains(s, cfg.Admin.Token) {
		t.Errorf("a secret is in the log:\n%s", s)
	}
}

// TestGatewayAllowAllWarns: the default configuration warns that any
// client gets in.
func TestGatewayAllowAllWarns(t *testing.T) {
	logs := new(captureHandler)
	mustStart(t, testConfig(t.TempDir(), 10, time.Second), deps{logger: slog.New(logs)})
	if rec := logs.find("authentication is off (allow-all)"); rec == nil || rec["level"] != "WARN" {
		t.Errorf("no allow-all warning:\n%s", logs)
	}
}

// TestGatewayCredentialsFileModes: a credentials file others may read
// (its hashes can be attacked offline) starts with a warning; one anyone
// may write does not start.
func TestGatewayCredentialsFileModes(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds")
	if err := passwd([]string{"--file", creds, "dev-1"}, strings.NewReader("pw\n"), new(strings.Builder)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(creds, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(filepath.Join(dir, "data"), 100, time.Second)
	cfg.Auth.CredentialsFile = creds
	logs := new(captureHandler)
	mustStart(t, cfg, deps{logger: slog.New(logs)})
	if rec := logs.find("credentials file readable"); rec == nil || rec["level"] != "WARN" || rec["mode"] != "-rw-r--r--" {
		t.Errorf("no warning about a 0644 credentials file: %v\n%s", rec, logs)
	}
	if err := os.Chmod(creds, 0o646); err != nil {
		t.Fatal(err)
	}
	if _, err := loadSecurity(cfg); err == nil || !strings.Contains(err.Error(), "writable by anyone") {
		t.Errorf("a world-writable credentials file: %v, want refused", err)
	}
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key
// to dir, and returns their paths and a pool trusting it.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gateway"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "admin.pem"), filepath.Join(dir, "admin.key")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestCredentialsReloadProcess: a running gateway takes an account
// added with gateway passwd after SIGHUP, and keeps its accounts when
// the file is broken.
func TestCredentialsReloadProcess(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds")
	add := func(user string) {
		t.Helper()
		if err := passwd([]string{"--file", creds, user}, strings.NewReader(user+"-pw\n"), new(strings.Builder)); err != nil {
			t.Fatal(err)
		}
	}
	add("dev-1")
	cfgPath := writeConfig(t, "mqtt: {tcp: \"127.0.0.1:0\"}\nauth: {credentials_file: "+strconv.Quote(creds)+"}\n")
	p := start(t, "serve", "--config", cfgPath, "--data-dir", filepath.Join(dir, "data"))
	addr := p.waitLine(listeningRE, 10*time.Second)[1]
	connect := func(user string) byte {
		t.Helper()
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c := paho.NewClient(paho.ClientConfig{Conn: conn})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ca, err := c.Connect(ctx, &paho.Connect{ClientID: user, CleanStart: true, Username: user, UsernameFlag: true,
			Password: []byte(user + "-pw"), PasswordFlag: true})
		if ca == nil {
			t.Fatalf("connect %s: %v", user, err)
		}
		_ = c.Disconnect(&paho.Disconnect{})
		return ca.ReasonCode
	}
	if code := connect("dev-2"); code != 0x86 {
		t.Fatalf("dev-2 before it was added: 0x%02x, want 0x86", code)
	}
	add("dev-2")
	hangup := func(re *regexp.Regexp) {
		t.Helper()
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		p.waitLine(re, 10*time.Second)
	}
	hangup(regexp.MustCompile(`msg="credentials reloaded".* accounts=2`))
	if code := connect("dev-2"); code != 0 {
		t.Fatalf("dev-2 after SIGHUP: 0x%02x, want 0x00", code)
	}
	if err := os.WriteFile(creds, []byte("dev-3:plain:device:\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hangup(regexp.MustCompile(`msg="credentials not reloaded; the accounts loaded before stay in force".*line 1`))
	if code := connect("dev-1"); code != 0 {
		t.Fatalf("dev-1 after a failed reload: 0x%02x, want 0x00", code)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, _ := p.wait(shutdownTimeout + 2*time.Second); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, p.stderr())
	}
}
