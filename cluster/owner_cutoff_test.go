package cluster

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// cutProxy forwards loopback TCP connections to a Redis server until
// cut: then it closes them all and refuses new ones, a gateway cut off
// from Redis while the others still reach it.
type cutProxy struct {
	ln    net.Listener
	to    string
	mu    sync.Mutex
	conns []net.Conn
	cut   bool
}

func startCutProxy(t *testing.T, to string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, to: to}
	t.Cleanup(func() { p.cutOff(); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.cut {
				p.mu.Unlock()
				c.Close()
				continue
			}
			up, err := net.Dial("tcp", to)
			if err != nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) cutOff() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// cutOwner starts an owner (fail-closed, timeouts of 200ms, gateway TTL
// ttl) that reaches srv through a proxy the test can cut.
func cutOwner(t *testing.T, srv *redistest.Server, ttl time.Duration) (*Owner, *cutProxy) {
	t.Helper()
	proxy := startCutProxy(t, srv.Addr)
	shared, _ := newLimiter(t, srv, 10, PolicyFailClosed, 200*time.Millisecond)
	rdb := redis.NewClient(ClientOptions(proxy.ln.Addr().String(), 200*time.Millisecond))
	t.Cleanup(func() { rdb.Close() })
	o, err := NewOwner(OwnerOptions{Client: rdb, Shared: shared, GatewayTTL: ttl, FlushInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Close)
	waitLeased(t, o)
	return o, proxy
}

// TestOwnerCutOffFromRedis: a gateway cut off from Redis (the others
// still reach it) stops deciding on its leases within its TTL of its
// last renewal (its decisions then take the failure policy, here
// fail-closed), and a gateway the device moves to serves it once the
// cut-off one's liveness key has expired, having charged its lease:
// never more than N over both, at most one lease lost.
func TestOwnerCutOffFromRedis(t *testing.T) {
	srv := redistest.Start(t)
	const ttl = 500 * time.Millisecond
	a, proxy := cutOwner(t, srv, ttl)
	b := newOwner(t, srv, 10, ttl)
	q := devicelimit.Quota{Limit: 20, Window: time.Hour}
	admitted := 0
	for range 8 {
		if a.AllowAt("d", q, t0).Allowed {
			admitted++
		}
	}
	proxy.cutOff()
	cut := time.Now()
	// A may admit within its durable lease until its fence lapses; then
	// every decision takes the policy.
	for a.leased() {
		if a.AllowAt("d", q, t0).Allowed {
			admitted++
		}
		if time.Since(cut) > 10*ttl {
			t.Fatal("A still decides on its leases long after it was cut off")
		}
	}
	fenced := time.Since(cut)
	if v := a.AllowAt("d", q, t0); v.Allowed || v.RetryAfter != failRetryAfter {
		t.Fatalf("A after its fence: %+v, want the fail-closed policy's refusal", v)
	}
	for b.o.AllowAt("d", q, t0).Allowed {
		admitted++
	}
	t.Logf("A fenced itself %v after the cut (TTL %v); %d admitted over both of 20 (lease 10)", fenced.Round(time.Millisecond), ttl, admitted)
	if fenced > ttl+ttl/2 {
		t.Errorf("A fenced itself %v after the cut, want within about its TTL %v", fenced, ttl)
	}
	if admitted > 20 || admitted < 10 {
		t.Fatalf("%d admitted over both gateways, want 10..20", admitted)
	}
}
