package proctest

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// startMosquitto starts mosquitto listening on addr and returns it with
// Serve's result, its ready check a TCP dial.
func startMosquitto(t *testing.T, addr string) (*Proc, error) {
	_, port, _ := net.SplitHostPort(addr)
	conf := filepath.Join(t.TempDir(), "mosquitto.conf")
	if err := os.WriteFile(conf, []byte("listener "+port+" 127.0.0.1\nallow_anonymous true\nuser root\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := Start(t, "mosquitto", "-c", conf)
	return p, p.Serve("mosquitto", addr, func() error {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// TestServeTakenPort: a server started on a port another listener holds
// exits; Serve reports ErrExited although the ready check (a dial)
// succeeds, answered by the other listener, not the process.
func TestServeTakenPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := startMosquitto(t, l.Addr().String()); !errors.Is(err, ErrExited) {
		t.Fatalf("got %v, want ErrExited", err)
	}
}

// TestOnFreePort: a server started by OnFreePort serves, and its
// process is the one listening.
func TestOnFreePort(t *testing.T) {
	var addr string
	p := OnFreePort(t, func(a string) { addr = a }, func() (*Proc, error) { return startMosquitto(t, addr) })
	if !listens(p.cmd.Process.Pid, addr) {
		t.Fatalf("process %d does not listen on %s", p.cmd.Process.Pid, addr)
	}
}
