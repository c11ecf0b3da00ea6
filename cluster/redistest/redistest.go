// Package redistest runs a real redis-server for tests: on a free
// loopback port, without persistence, killed by PID at the test's end.
package redistest

import (
	"bytes"
	"context"
	"devicegate/internal/freeport"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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
	cmd  *exec.Cmd
	out  *bytes.Buffer
	// cluster, when set, is the directory of the node's cluster
	// config file: the server runs in cluster mode.
	cluster string
}

// Start runs redis-server on a free loopback port and waits until it
// answers PING. A missing redis-server fails the test: run
// scripts/ensure-tools.sh.
func Start(t testing.TB) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not found (run scripts/ensure-tools.sh): %v", err)
	}
	s := &Server{t: t, port: freePort(t)}
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
	s.start()
	t.Cleanup(s.Kill)
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

func (s *Server) start() {
	s.t.Helper()
	s.out = new(bytes.Buffer)
	args := []string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--protected-mode", "yes", "--loglevel", "warning"}
	if s.cluster != "" {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(s.cluster, "nodes.conf"))
	}
	s.cmd = exec.Command("redis-server", args...)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.Kill()
			s.t.Fatalf("redis-server on %s not ready after 10s: %v\n%s", s.Addr, err, s.out)
		}
		time.Sleep(10 * time.Millisecond) // polling for readiness, not letting time pass
	}
}

// Kill ends the server with SIGKILL, by PID, and waits for it. Safe to
// call more than once.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart starts a new, empty server on the same port after Kill.
func (s *Server) Restart() {
	s.t.Helper()
	if s.cmd != nil {
		s.t.Fatalf("redistest: Restart before Kill")
	}
	s.start()
}

// Stop pauses the server (SIGSTOP): it keeps its connections but
// answers nothing, like a Redis stuck or too slow. Cont resumes it.
func (s *Server) Stop() { s.signal(syscall.SIGSTOP) }

// Cont resumes a server paused by Stop.
func (s *Server) Cont() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("signal %s to redis-server %d: %v", sig, s.cmd.Process.Pid, err)
	}
}

// Client returns a client of the server, closed at the test's end.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
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
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("redis-cli not found (run scripts/ensure-tools.sh): %v", err)
	}
	c := &Cluster{}
	for range n {
		s := &Server{t: t, port: freePort(t), cluster: t.TempDir()}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		s.start()
		t.Cleanup(s.Kill)
		c.Nodes = append(c.Nodes, s)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
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
