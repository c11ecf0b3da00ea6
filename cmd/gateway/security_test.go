package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/devicegate/devicegate/server"
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
	hangup(regexp.MustCompile(`msg="configuration reloaded".* accounts=2`))
	if code := connect("dev-2"); code != 0 {
		t.Fatalf("dev-2 after SIGHUP: 0x%02x, want 0x00", code)
	}
	if err := os.WriteFile(creds, []byte("dev-3:plain:device:\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hangup(regexp.MustCompile(`msg="configuration not reloaded; the running configuration stays".*line 1`))
	if code := connect("dev-1"); code != 0 {
		t.Fatalf("dev-1 after a failed reload: 0x%02x, want 0x00", code)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, _ := p.wait(server.ShutdownTimeout + 2*time.Second); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, p.stderr())
	}
}
