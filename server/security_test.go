package server

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"golang.org/x/crypto/bcrypt"

	"github.com/devicegate/devicegate/auth"
	"github.com/devicegate/devicegate/internal/logtest"
	"github.com/devicegate/devicegate/internal/testcert"
)

// putAccount adds a device account with a bcrypt password to the
// credentials file, as gateway passwd does, but at bcrypt's lowest cost
// (4, not gateway passwd's 10): the cost is not what these tests test,
// and under the race detector on a loaded 2-core machine one check at
// cost 10 took over 5 s, past the client's CONNECT deadline
// (TestGatewayCredentials failed 4 of 4 runs at load 18).
func putAccount(file, username, password string) error {
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		return err
	}
	return auth.Put(file, auth.Entry{Username: username, Role: auth.RoleDevice, Hash: string(hash)})
}

// TestGatewayCredentials starts the gateway with a credentials file
// made by gateway passwd and an admin API over TLS: a wrong password is
// refused, a publish outside the device's prefix gets 0x87, and both
// show in /metrics, read over HTTPS; neither password nor token is logged.
func TestGatewayCredentials(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds")
	if err := putAccount(creds, "dev-1", "s3cret-pw"); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, pool := testcert.SelfSigned(t, dir)
	cfg := testConfig(filepath.Join(dir, "data"), 100, time.Second)
	cfg.Auth.CredentialsFile = creds
	cfg.Admin.TLS.CertFile, cfg.Admin.TLS.KeyFile = certFile, keyFile
	cfg.Admin.Token = "admin-token-never-logged"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	logs := new(logtest.Capture)
	g := mustStart(t, cfg, Deps{Logger: slog.New(logs)})
	if rec := logs.Find("authentication on"); rec == nil || rec["accounts"] != "1" {
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
	logs := new(logtest.Capture)
	mustStart(t, testConfig(t.TempDir(), 10, time.Second), Deps{Logger: slog.New(logs)})
	if rec := logs.Find("authentication is off (allow-all)"); rec == nil || rec["level"] != "WARN" {
		t.Errorf("no allow-all warning:\n%s", logs)
	}
}

// TestGatewayCredentialsFileModes: a credentials file others may read
// (its hashes can be attacked offline) starts with a warning; one anyone
// may write does not start.
func TestGatewayCredentialsFileModes(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds")
	if err := putAccount(creds, "dev-1", "pw"); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(creds, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(filepath.Join(dir, "data"), 100, time.Second)
	cfg.Auth.CredentialsFile = creds
	logs := new(logtest.Capture)
	mustStart(t, cfg, Deps{Logger: slog.New(logs)})
	if rec := logs.Find("credentials file readable"); rec == nil || rec["level"] != "WARN" || rec["mode"] != "-rw-r--r--" {
		t.Errorf("no warning about a 0644 credentials file: %v\n%s", rec, logs)
	}
	if err := os.Chmod(creds, 0o646); err != nil {
		t.Fatal(err)
	}
	if _, err := loadSecurity(cfg); err == nil || !strings.Contains(err.Error(), "writable by anyone") {
		t.Errorf("a world-writable credentials file: %v, want refused", err)
	}
}
