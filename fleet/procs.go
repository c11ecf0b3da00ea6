package fleet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/internal/freeport"
	"github.com/devicegate/devicegate/internal/logtest"
)

// Proc is a server process the fleet started (redis-server, haproxy):
// its output kept, killed with this process (childAttr) and stopped by
// its PID only.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	done chan struct{}
	out  logtest.Buffer
}

// Tool returns the path of program name: PATH, then /usr/sbin and
// /sbin, where Debian puts servers (haproxy, mosquitto).
func Tool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found (scripts/ensure-tools.sh installs it)", name)
}

// StartProc runs program name with args.
func StartProc(name string, args ...string) (*Proc, error) {
	path, err := Tool(name)
	if err != nil {
		return nil, err
	}
	p := &Proc{Name: name, cmd: exec.Command(path, args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.SysProcAttr = childAttr()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

// Output returns what the process wrote so far.
func (p *Proc) Output() string { return p.out.String() }

// PID is the process's ID.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill sends SIGKILL and waits for the process to end.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// waitReady polls ready until it returns nil, the process exits, or
// within passes.
func (p *Proc) waitReady(within time.Duration, ready func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if p.Exited() {
			return fmt.Errorf("%s exited at start:\n%s", p.Name, p.Output())
		}
		if time.Now().After(deadline) {
			p.Kill()
			return fmt.Errorf("%s not ready within %s: %v\n%s", p.Name, within, err, p.Output())
		}
		time.Sleep(20 * time.Millisecond) // polling a process for readiness
	}
}

// Redis is a redis-server, or the masters (and replicas) of a Redis
// Cluster, without persistence, on loopback ports.
type Redis struct {
	// Addrs are the servers' addresses, masters first.
	Addrs []string
	Procs []*Proc

	mu   sync.Mutex
	last []RedisStats // each server's counters at its last reading
}

// StartRedis runs one redis-server (masters 0) or a Redis Cluster of
// masters and as many replicas each, in dir.
func StartRedis(dir string, masters, replicas int) (*Redis, error) {
	r := &Redis{}
	n := 1
	if masters > 0 {
		n = masters * (1 + replicas)
	}
	for i := range n {
		addr, err := clusterAddr()
		if err != nil {
			r.Close()
			return nil, err
		}
		_, port, _ := net.SplitHostPort(addr)
		args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--protected-mode", "yes", "--loglevel", "warning"}
		if masters > 0 {
			nd := filepath.Join(dir, "redis-"+port)
			if err := os.MkdirAll(nd, 0o700); err != nil {
				r.Close()
				return nil, err
			}
			args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(nd, "nodes.conf"),
				"--dir", nd, "--cluster-node-timeout", "2000")
		}
		p, err := StartProc("redis-server", args...)
		if err != nil {
			r.Close()
			return nil, err
		}
		r.Addrs, r.Procs = append(r.Addrs, addr), append(r.Procs, p)
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
		err = p.waitReady(15*time.Second, func() error { return c.Ping(context.Background()).Err() })
		c.Close()
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("redis-server %d: %w", i, err)
		}
	}
	if masters == 0 {
		return r, nil
	}
	cli, err := Tool("redis-cli")
	if err != nil {
		r.Close()
		return nil, err
	}
	args := append([]string{"--cluster", "create"}, r.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		r.Close()
		return nil, fmt.Errorf("redis-cli %v: %v\n%s", args, err, out)
	}
	for i, addr := range r.Addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		err := r.Procs[i].waitReady(30*time.Second, func() error {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && !strings.Contains(info, "cluster_state:ok") {
				err = errors.New("cluster_state not ok")
			}
			return err
		})
		c.Close()
		if err != nil {
			r.Close()
			return nil, err
		}
	}
	return r, nil
}

// clusterAddr returns a free loopback address whose port plus 10000 (a
// cluster node's bus port) is free too.
func clusterAddr() (string, error) {
	for range 100 {
		addr, err := freeport.Addr()
		if err != nil {
			return "", err
		}
		_, port, _ := net.SplitHostPort(addr)
		n, _ := strconv.Atoi(port)
		if n+10000 > 65535 {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(n+10000)))
		if err != nil {
			continue
		}
		l.Close()
		return addr, nil
	}
	return "", errors.New("no free port with a free cluster bus port in 100 tries")
}

// Close kills every server.
func (r *Redis) Close() {
	for _, p := range r.Procs {
		if !p.Exited() {
			p.Kill()
		}
	}
}

// waitClusterOK polls the Cluster nodes still running until one counts
// the killed node (killed) as failed (fail, not just suspected, fail?)
// and says cluster_state:ok, its slots served by a promoted replica; it
// returns how long that took, 0 when not within.
func (r *Redis) waitClusterOK(ctx context.Context, killed string, within time.Duration) time.Duration {
	start := time.Now()
	for time.Since(start) < within && ctx.Err() == nil {
		for i, addr := range r.Addrs {
			if r.Procs[i].Exited() {
				continue
			}
			c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
			info, err := c.ClusterInfo(ctx).Result()
			nodes, nerr := c.ClusterNodes(ctx).Result()
			c.Close()
			if err == nil && nerr == nil && strings.Contains(info, "cluster_state:ok") && nodeFailed(nodes, killed) {
				return time.Since(start)
			}
			break
		}
		time.Sleep(100 * time.Millisecond) // polling another process's state
	}
	return 0
}

// nodeFailed reports whether CLUSTER NODES output flags the node at
// addr as failed.
func nodeFailed(nodes, addr string) bool {
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && strings.HasPrefix(f[1], addr+"@") {
			for _, flag := range strings.Split(f[2], ",") {
				if flag == "fail" {
					return true
				}
			}
		}
	}
	return false
}
