// Package proctest runs the server processes tests use (redis-server,
// mosquitto, nats-server): started with their output kept, killed with
// the test process (Pdeathsig) and at the test's end, paused and
// resumed with signals, always by PID.
package proctest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/freeport"
	"github.com/devicegate/devicegate/internal/logtest"
)

// Proc is one run of a server process.
type Proc struct {
	t    testing.TB
	cmd  *exec.Cmd
	out  logtest.Buffer
	done chan struct{} // closed when the process has ended and been reaped
}

// Tool returns the path of program name (PATH, then /usr/sbin and
// /usr/bin, where Debian puts servers), failing the test when it is
// missing: it never skips.
func Tool(t testing.TB, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin"} {
		if p := filepath.Join(dir, name); fileExists(p) {
			return p
		}
	}
	t.Fatalf("%s not found (scripts/ensure-tools.sh installs it; `make test` runs that)", name)
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// Start runs name (found by Tool) with args until Kill or the test's
// end.
func Start(t testing.TB, name string, args ...string) *Proc {
	t.Helper()
	p := &Proc{t: t, cmd: exec.Command(Tool(t, name), args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(p.Kill)
	return p
}

// ErrExited is Serve's error when the process ended before it served.
var ErrExited = errors.New("process exited before it served")

// Ready polls ready until it returns nil, failing the test (with the
// process's output) when the process ends first or after 10 s.
func (p *Proc) Ready(what string, ready func() error) {
	p.t.Helper()
	if err := p.Serve(what, "", ready); err != nil {
		p.t.Fatalf("%s: %v\n%s", what, err, p.Output())
	}
}

// Serve polls ready until it returns nil and, when addr is not empty,
// the process itself listens on addr's port: a ready check answered by
// another process that holds the port does not count. It returns an
// error wrapping ErrExited when the process ends first (a server that
// found its port taken exits), and fails the test after 10 s.
func (p *Proc) Serve(what, addr string, ready func() error) error {
	p.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := ready()
		if err == nil && addr != "" && !listens(p.cmd.Process.Pid, addr) {
			err = fmt.Errorf("process %d does not listen on %s", p.cmd.Process.Pid, addr)
		}
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s on %s: %w (%v): %s", what, addr, ErrExited, p.cmd.ProcessState, strings.TrimSpace(p.Output()))
		default:
		}
		if time.Now().After(deadline) {
			p.Kill()
			p.t.Fatalf("%s not ready after 10s: %v\n%s", what, err, p.Output())
		}
		time.Sleep(10 * time.Millisecond) // polling for readiness, not letting time pass
	}
}

// Kill ends the process with SIGKILL (resuming it first, if paused) and
// waits for it. Safe to call more than once.
func (p *Proc) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Term ends the process with SIGTERM, letting it save what it keeps,
// and waits for it.
func (p *Proc) Term() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.done
}

// Pause stops the process (SIGSTOP): its connections stay open and
// nothing is answered, as over a dead link or a stuck server. It returns
// once the kernel has stopped it.
func (p *Proc) Pause() {
	p.t.Helper()
	p.signal(syscall.SIGSTOP)
	stat := fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(stat)
		// The state follows the command name in parentheses: "pid (comm) T ...".
		if i := strings.LastIndexByte(string(b), ')'); err == nil && i+2 < len(b) && b[i+2] == 'T' {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("process %d did not stop within 10s of SIGSTOP", p.cmd.Process.Pid)
		}
		time.Sleep(time.Millisecond) // waiting for the kernel to stop it
	}
}

// Resume continues a paused process.
func (p *Proc) Resume() { p.signal(syscall.SIGCONT) }

// Hangup sends SIGHUP (a reload, to most servers).
func (p *Proc) Hangup() { p.signal(syscall.SIGHUP) }

func (p *Proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %s to process %d: %v", sig, p.cmd.Process.Pid, err)
	}
}

// Output returns what the process wrote so far.
func (p *Proc) Output() string { return p.out.String() }

// Server is a server process a test may kill, pause and start again:
// start runs one process (on the same address and store each time) and
// returns once it serves.
type Server struct {
	t     testing.TB
	start func() *Proc
	proc  *Proc
}

// NewServer runs start once and returns the server.
func NewServer(t testing.TB, start func() *Proc) *Server {
	t.Helper()
	return &Server{t: t, start: start, proc: start()}
}

// NewServerOnFreePort runs a server on a loopback address picked by
// freeport.Addr: setAddr stores the address that launch (and every
// Restart) starts the process on; launch starts it and returns Serve's
// result. A first launch whose process exits before it serves (another
// process took the port between the pick and the bind) is tried again
// on a new address, up to 5 times; a Restart keeps the address.
func NewServerOnFreePort(t testing.TB, setAddr func(addr string), launch func() (*Proc, error)) *Server {
	t.Helper()
	start := func() *Proc {
		t.Helper()
		p, err := launch()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	return &Server{t: t, start: start, proc: OnFreePort(t, setAddr, launch)}
}

// OnFreePort is NewServerOnFreePort's first start, for a server type of
// its own: it returns the process that serves.
func OnFreePort(t testing.TB, setAddr func(addr string), launch func() (*Proc, error)) *Proc {
	t.Helper()
	var errs []error
	for range 5 {
		addr, err := freeport.Addr()
		if err != nil {
			t.Fatal(err)
		}
		setAddr(addr)
		p, err := launch()
		if err == nil {
			return p
		}
		if !errors.Is(err, ErrExited) {
			t.Fatal(err)
		}
		errs = append(errs, err)
	}
	t.Fatalf("no free port served in 5 tries: %v", errors.Join(errs...))
	return nil
}

// Kill ends the process with SIGKILL and waits for it. Safe to call
// more than once.
func (s *Server) Kill() {
	if s.proc != nil {
		s.proc.Kill()
		s.proc = nil
	}
}

// Restart starts the server again after Kill.
func (s *Server) Restart() {
	s.t.Helper()
	if s.proc != nil {
		s.t.Fatalf("Restart before Kill")
	}
	s.proc = s.start()
}

// Stop pauses the server (SIGSTOP): it keeps its connections but
// answers nothing, like a server stuck or a link gone dead. Cont
// resumes it.
func (s *Server) Stop() { s.proc.Pause() }

// Cont resumes a server paused by Stop.
func (s *Server) Cont() { s.proc.Resume() }
