package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/freeport"
)

// TestSystemdReadiness: with NOTIFY_SOCKET naming a datagram socket the
// test listens on, the gateway sends READY=1 once its MQTT listener
// accepts connections (dialled the moment the datagram arrives), and
// STOPPING=1 when it is told to stop.
func TestSystemdReadiness(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NOTIFY_SOCKET", sock) // inherited by the child
	p := start(t, "serve", "--mqtt-addr", addr, "--data-dir", t.TempDir())
	read := func() string {
		t.Helper()
		buf := make([]byte, 4096)
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("no notification: %v; stderr:\n%s", err, p.stderr())
		}
		return string(buf[:n])
	}
	ready := read()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("READY=1 came before the MQTT listener accepted: %v", err)
	}
	c.Close()
	if !strings.Contains(ready, "READY=1\n") || !strings.Contains(ready, "MAINPID=") {
		t.Fatalf("readiness datagram %q", ready)
	}
	p.cmd.Process.Signal(os.Interrupt)
	if got := read(); got != "STOPPING=1" {
		t.Fatalf("on stop: %q, want STOPPING=1", got)
	}
	if code, _ := p.wait(10 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// TestSystemdUnitVerifies: systemd-analyze verify finds nothing to say
// about deploy/systemd/devicegate.service (its binary path pointed at
// the test's build), and the unit is the one the docs describe:
// Type=notify, reload by SIGHUP, the sandbox.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd is not installed here")
	}
	unit, err := os.ReadFile(filepath.Join(sourceDir, "..", "..", "deploy", "systemd", "devicegate.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "LimitNOFILE=", "NoNewPrivileges=true",
		"ProtectSystem=strict", "ReadWritePaths=/var/lib/devicegate", "PrivateTmp=true", "RestrictAddressFamilies=", "SystemCallFilter=@system-service"} {
		if !strings.Contains(string(unit), "\n"+want) {
			t.Errorf("unit lacks %q", want)
		}
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "devicegate.service")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(unit), "/usr/local/bin/gateway", binary)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
