// Package mosquittotest runs a real Mosquitto broker for tests: the
// upstream the gateway forwards to. `make test` installs the mosquitto
// package when it is missing; a missing binary fails the test.
package mosquittotest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Server is a running mosquitto on 127.0.0.1.
type Server struct {
	Addr string
	cmd  *exec.Cmd
	t    testing.TB
}

// Start runs mosquitto on a free loopback port, anonymous clients
// allowed, no persistence; the test's cleanup stops it.
func Start(t testing.TB) *Server { return start(t, true) }

// StartClosed is Start with anonymous clients refused and no accounts:
// every login is refused (CONNACK 5, not authorized).
func StartClosed(t testing.TB) *Server { return start(t, false) }

func start(t testing.TB, anonymous bool) *Server {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/mosquitto"); serr != nil {
			t.Fatalf("mosquitto not found (package mosquitto; `make test` installs it): %v", err)
		}
		bin = "/usr/sbin/mosquitto"
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	conf := filepath.Join(t.TempDir(), "mosquitto.conf")
	if err := os.WriteFile(conf, []byte("listener "+port+" 127.0.0.1\nallow_anonymous "+strconv.FormatBool(anonymous)+"\npersistence false\nlog_dest stderr\nlog_type error\nuser root\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", conf)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start mosquitto: %v", err)
	}
	s := &Server{Addr: addr, cmd: cmd, t: t}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT) // if a test paused it
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("mosquitto did not listen on %s within 10s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond) // waiting for a process to listen
	}
}

// Pause stops the broker's process (SIGSTOP): connections stay open and
// nothing is answered, as over a link that went dead. It returns once
// the process is stopped (a signal is delivered asynchronously).
func (s *Server) Pause() {
	_ = s.cmd.Process.Signal(syscall.SIGSTOP)
	stat := fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(stat)
		// The state follows the command name in parentheses: "pid (comm) T ...".
		if i := strings.LastIndexByte(string(b), ')'); err == nil && i+2 < len(b) && b[i+2] == 'T' {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("mosquitto did not stop within 10s of SIGSTOP")
		}
		time.Sleep(time.Millisecond) // waiting for the kernel to stop it
	}
}

// Resume continues a paused broker.
func (s *Server) Resume() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }
