// Package redistest runs a real redis-server for tests: on a free
// loopback port, without persistence, killed by PID at the test's end.
package redistest

import (
	"context"
	"crypto/tls"
	"fmt"
	"github.com/devicegate/devicegate/internal/freeport"
	"github.com/devicegate/devicegate/internal/proctest"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process started by Start.
type Server struct {
	// Addr is the server's "127.0.0.1:port"; it stays the same across
	// Kill and Restart.
	Addr string
	t    testing.TB
	port int
	// Kill, Restart (on the same port: empty, or, started by
	// StartDurable, with what it had acknowledged), Stop and Cont.
	*proctest.Server
	// cluster, when set, is the directory of the node's cluster
	// config file: the server runs in cluster mode.
	cluster string
	// dir, when set, holds the append-only file of a durable server.
	dir string
	// tlsArgs, when set, serve clients over TLS only; tls is this
	// package's clients' configuration then.
	tlsArgs []string
	tls     *tls.Config
}

// Start runs redis-server, without persistence, on a free loopback port
// and waits until it answers PING. A missing redis-server fails the
// test: run scripts/ensure-tools.sh.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, "")
}

// StartDurable is Start with an append-only file fsynced on every
// write, in the test's temporary directory: what Redis acknowledged
// survives Kill, and Restart serves it again.
func StartDurable(t testing.TB) *Server {
	t.Helper()
	return start(t, t.TempDir())
}

// StartTLS is Start with clients served over TLS only, with the server
// certificate and key in certFile and keyFile (clients need no
// certificate); client is the TLS configuration of this package's own
// clients (its CAs).
func StartTLS(t testing.TB, certFile, keyFile string, client *tls.Config) *Server {
	t.Helper()
	s := &Server{t: t, port: freePort(t), tls: client,
		tlsArgs: []string{"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-auth-clients", "no"}}
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
	s.Server = proctest.NewServer(t, s.start)
	return s
}

func start(t testing.TB, dir string) *Server {
	t.Helper()
	s := &Server{t: t, port: freePort(t), dir: dir}
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
	s.Server = proctest.NewServer(t, s.start)
	return s
}

// freePort returns a loopback port that was free a moment ago:
// redis-server cannot pick its own (--port 0 disables TCP).
func freePort(t testing.TB) int {
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	_, port, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(port)
	return n
}

// clusterPort returns a free port whose cluster bus port (the port plus
// 10000, where a cluster node also listens) is free too: a busy machine's
// ephemeral ports can hold the second when only the first was checked.
func clusterPort(t testing.TB) int {
	t.Helper()
	for range 100 {
		p := freePort(t)
		if p+10000 > 65535 {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+10000)))
		if err != nil {
			continue
		}
		l.Close()
		return p
	}
	t.Fatal("no free port with a free cluster bus port (+10000) in 100 tries")
	return 0
}

func (s *Server) start() *proctest.Proc {
	s.t.Helper()
	args := []string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--protected-mode", "yes", "--loglevel", "warning"}
	if s.tlsArgs != nil {
		args = append([]string{"--port", "0", "--tls-port", strconv.Itoa(s.port)}, append(args[2:], s.tlsArgs...)...)
	}
	if s.dir != "" {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always", "--dir", s.dir)
	} else {
		args = append(args, "--appendonly", "no")
	}
	if s.cluster != "" {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(s.cluster, "nodes.conf"))
	}
	p := proctest.Start(s.t, "redis-server", args...)
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond, TLSConfig: s.tls})
	defer c.Close()
	p.Ready("redis-server on "+s.Addr, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		return c.Ping(ctx).Err()
	})
	return p
}

// Client returns a client of the server, closed at the test's end.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, TLSConfig: s.tls})
	s.t.Cleanup(func() { c.Close() })
	return c
}

// String returns the address.
func (s *Server) String() string { return fmt.Sprintf("redis-server %s", s.Addr) }

// Cluster is a Redis Cluster of redis-server processes started by
// StartCluster, every one a master.
type Cluster struct {
	Nodes []*Server
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr
	}
	return out
}

// StartCluster runs n (at least 3) redis-server processes in cluster
// mode on free loopback ports, joins them with redis-cli --cluster
// create, and waits until the cluster serves every slot.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	cli := proctest.Tool(t, "redis-cli")
	c := &Cluster{}
	for range n {
		s := &Server{t: t, port: clusterPort(t), cluster: t.TempDir()}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		s.Server = proctest.NewServer(t, s.start)
		c.Nodes = append(c.Nodes, s)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, n := range c.Nodes { // each node must know the cluster is up
		cl := redis.NewClient(&redis.Options{Addr: n.Addr})
		for {
			info, err := cl.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				cl.Close()
				t.Fatalf("redis cluster node %s not ok after 20s: %v\n%s", n.Addr, err, info)
			}
			time.Sleep(20 * time.Millisecond) // polling for readiness
		}
		cl.Close()
	}
	return c
}
