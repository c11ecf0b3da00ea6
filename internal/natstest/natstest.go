// Package natstest runs a real nats-server with JetStream for tests: on
// a free loopback port, its store in the test's temporary directory,
// killed by PID at the test's end.
package natstest

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/devicegate/devicegate/internal/proctest"
)

// Server is a nats-server process started by Start.
type Server struct {
	// Addr is the server's "127.0.0.1:port"; it stays the same across
	// Kill and Restart, and so does the JetStream store.
	Addr string
	// URL is "nats://" + Addr.
	URL   string
	t     testing.TB
	store string
	args  []string      // the server's own, beyond address and store
	opts  []nats.Option // this package's clients'
	// Kill, Restart (same port and store: the streams and what they
	// hold survive), Stop and Cont.
	*proctest.Server
}

// Start runs nats-server with JetStream on a free loopback port and
// waits until JetStream answers. A missing nats-server fails the test:
// run scripts/ensure-tools.sh.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, nil, nil)
}

// StartTLS is Start with clients served over TLS only, with the server
// certificate and key in certFile and keyFile; client is the TLS
// configuration of this package's own clients (its CAs).
func StartTLS(t testing.TB, certFile, keyFile string, client *tls.Config) *Server {
	t.Helper()
	return start(t, []string{"--tls", "--tlscert", certFile, "--tlskey", keyFile}, []nats.Option{nats.Secure(client)})
}

func start(t testing.TB, args []string, opts []nats.Option) *Server {
	t.Helper()
	s := &Server{t: t, store: t.TempDir(), args: args, opts: opts}
	s.Server = proctest.NewServerOnFreePort(t, func(addr string) { s.Addr, s.URL = addr, "nats://"+addr }, s.launch)
	return s
}

func (s *Server) launch() (*proctest.Proc, error) {
	s.t.Helper()
	host, port, _ := net.SplitHostPort(s.Addr)
	p := proctest.Start(s.t, "nats-server", append([]string{"-a", host, "-p", port, "-js", "-sd", s.store}, s.args...)...)
	return p, p.Serve("nats-server", s.Addr, s.ready)
}

// ready reports whether JetStream answers on the server.
func (s *Server) ready() error {
	nc, err := nats.Connect(s.URL, append([]nats.Option{nats.Timeout(200 * time.Millisecond), nats.NoReconnect()}, s.opts...)...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

// JetStream returns a JetStream client of the server (reconnecting
// through restarts), closed at the test's end.
func (s *Server) JetStream() jetstream.JetStream {
	s.t.Helper()
	nc, err := nats.Connect(s.URL, append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, s.opts...)...)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		s.t.Fatal(err)
	}
	return js
}

// CreateStream makes a file-backed stream of the given subjects.
func (s *Server) CreateStream(name string, subjects ...string) jetstream.Stream {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := s.JetStream().CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: subjects, Storage: jetstream.FileStorage})
	if err != nil {
		s.t.Fatalf("create stream %s: %v", name, err)
	}
	return st
}
