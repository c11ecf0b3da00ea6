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
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/proctest"
)

// Options shape the broker.
type Options struct {
	// Users are the accounts (name: password); with none, anonymous
	// clients are allowed unless Closed.
	Users map[string]string
	// Closed refuses every login (CONNACK 5, not authorized).
	Closed bool
	// TLS, when set, makes the listener speak TLS only.
	TLS *TLS
	// MaxQueued, when > 0, is max_queued_messages (0: no bound). With
	// no bound, Mosquitto 2.0 ends the connection of an MQTT 5 client
	// after each publish it refuses (its check of the queue against 0
	// always fails).
	MaxQueued int
	// ACL, when set, is the acl_file's text (SetACL changes it).
	ACL string
	// MaxPacketSize, when > 0, is max_packet_size: Mosquitto ends the
	// connection of a client that sends a larger packet (an MQTT 3.1.1
	// client cannot be told the bound).
	MaxPacketSize int
	// Persist keeps sessions (and their queued messages) across Stop
	// and Restart, in the test's directory.
	Persist bool
}

// TLS holds a TLS listener's PEM files.
type TLS struct {
	CAFile, CertFile, KeyFile string
	// RequireCert asks clients for a certificate signed by CAFile
	// (mutual TLS).
	RequireCert bool
}

// Server is a running mosquitto on 127.0.0.1.
type Server struct {
	Addr string
	conf string
	text []string // the configuration without its listener line
	acl  string
	pw   string // the password file, with Users
	proc *proctest.Proc
	t    testing.TB
}

// Start runs mosquitto on a free loopback port, anonymous clients
// allowed, no persistence; the test's cleanup stops it.
func Start(t testing.TB) *Server { return StartWith(t, Options{}) }

// StartClosed is Start with anonymous clients refused and no accounts:
// every login is refused (CONNACK 5, not authorized).
func StartClosed(t testing.TB) *Server { return StartWith(t, Options{Closed: true}) }

// StartWith runs mosquitto shaped by o on a free loopback port; the
// test's cleanup stops it.
func StartWith(t testing.TB, o Options) *Server {
	t.Helper()
	dir := t.TempDir()
	s := &Server{conf: filepath.Join(dir, "mosquitto.conf"), t: t}
	// No bound on the messages queued for a client: a test upstream
	// must not lose what it accepted (Mosquitto's default keeps 1000).
	conf := []string{"log_dest stderr", "log_type error", "user root", fmt.Sprintf("max_queued_messages %d", o.MaxQueued)}
	switch {
	case len(o.Users) > 0:
		pw := filepath.Join(dir, "passwd")
		s.pw = pw
		for user, pass := range o.Users {
			args := []string{"-b", pw, user, pass}
			if _, err := os.Stat(pw); err != nil {
				args = append([]string{"-c"}, args...)
			}
			if out, err := exec.Command(proctest.Tool(t, "mosquitto_passwd"), args...).CombinedOutput(); err != nil {
				t.Fatalf("mosquitto_passwd: %v: %s", err, out)
			}
		}
		conf = append(conf, "allow_anonymous false", "password_file "+pw)
	case o.Closed:
		conf = append(conf, "allow_anonymous false")
	default:
		conf = append(conf, "allow_anonymous true")
	}
	if o.TLS != nil {
		conf = append(conf, "cafile "+o.TLS.CAFile, "certfile "+o.TLS.CertFile, "keyfile "+o.TLS.KeyFile,
			fmt.Sprintf("require_certificate %v", o.TLS.RequireCert))
	}
	if o.ACL != "" {
		s.acl = filepath.Join(dir, "acl")
		if err := os.WriteFile(s.acl, []byte(o.ACL), 0o600); err != nil {
			t.Fatal(err)
		}
		conf = append(conf, "acl_file "+s.acl)
	}
	if o.MaxPacketSize > 0 {
		conf = append(conf, fmt.Sprintf("max_packet_size %d", o.MaxPacketSize))
	}
	if o.Persist {
		conf = append(conf, "persistence true", "persistence_location "+dir+"/", "autosave_interval 0")
	} else {
		conf = append(conf, "persistence false")
	}
	s.text = conf
	s.proc = proctest.OnFreePort(t, func(addr string) { s.Addr = addr }, s.launch)
	return s
}

// launch writes the configuration with the listener on s.Addr, starts
// the process and waits until it listens there.
func (s *Server) launch() (*proctest.Proc, error) {
	s.t.Helper()
	_, port, _ := net.SplitHostPort(s.Addr)
	conf := append([]string{"listener " + port + " 127.0.0.1"}, s.text...)
	if err := os.WriteFile(s.conf, []byte(strings.Join(conf, "\n")+"\n"), 0o600); err != nil {
		s.t.Fatal(err)
	}
	p := proctest.Start(s.t, "mosquitto", "-c", s.conf)
	return p, p.Serve("mosquitto", s.Addr, func() error {
		c, err := net.DialTimeout("tcp", s.Addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// run starts the process on s.Addr again and waits until it listens.
func (s *Server) run() {
	s.t.Helper()
	p, err := s.launch()
	if err != nil {
		s.t.Fatal(err)
	}
	s.proc = p
}

// Stop ends the broker (SIGTERM: with Persist, it saves its sessions)
// and waits for it.
func (s *Server) Stop() { s.proc.Term() }

// Restart starts a stopped broker again on the same address.
func (s *Server) Restart() { s.run() }

// Pause stops the broker's process (SIGSTOP): connections stay open and
// nothing is answered, as over a link that went dead. It returns once
// the process is stopped (a signal is delivered asynchronously).
func (s *Server) Pause() { s.proc.Pause() }

// SetACL replaces the acl_file's text (the broker was started with an
// ACL) and has the broker read it again (SIGHUP).
func (s *Server) SetACL(acl string) {
	s.t.Helper()
	if err := os.WriteFile(s.acl, []byte(acl), 0o600); err != nil {
		s.t.Fatal(err)
	}
	s.proc.Hangup()
}

// SetPassword sets user's password in the password file (the broker was
// started with Users). A running broker reads it at its next Restart.
func (s *Server) SetPassword(user, password string) {
	s.t.Helper()
	if out, err := exec.Command(proctest.Tool(s.t, "mosquitto_passwd"), "-b", s.pw, user, password).CombinedOutput(); err != nil {
		s.t.Fatalf("mosquitto_passwd: %v: %s", err, out)
	}
}

// Resume continues a paused broker.
func (s *Server) Resume() { s.proc.Resume() }
