package cluster

import (
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/internal/poll"
)

// TestOwnerClosedDecidesNoLease: once Close returns, the owner uses no
// lease (its liveness key is gone, so another gateway's claim settles
// at once); before, its fence ran on to the TTL and a decision after
// Close could admit on a lease the claimant did not charge.
func TestOwnerClosedDecidesNoLease(t *testing.T) {
	srv := redistest.Start(t)
	g := newOwner(t, srv, 20, 30*time.Second)
	g.o.Close()
	if g.o.leased() {
		t.Fatal("a closed owner still decides on its leases")
	}
}

// TestOwnerClaimAfterClose: a claim made after Close (a connection the
// broker accepted while it stopped) fails at once instead of waiting
// for a claimer that no longer runs.
func TestOwnerClaimAfterClose(t *testing.T) {
	srv := redistest.Start(t)
	g := newOwner(t, srv, 20, 30*time.Second)
	g.o.Close()
	done := make(chan error, 1)
	go func() { done <- g.o.Claim("late") }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a claim after Close succeeded")
		}
	case <-time.After(time.Minute):
		t.Fatal("a claim after Close still waits a minute later")
	}
}

// TestOwnerCloseRenewalInFlight: Close with Redis not answering (SIGSTOP)
// ends within closeTimeout and a little, however long a liveness
// renewal under way would still wait: a gateway's shutdown
// (server.ShutdownTimeout, 5 s) must leave time for its final snapshot.
// Before, Close waited for the renewal's own timeout (a quarter of the
// gateway TTL, 5 s here) and then for the releases: 7 s.
func TestOwnerCloseRenewalInFlight(t *testing.T) {
	srv := redistest.Start(t)
	shared, _ := newLimiter(t, srv, 20, PolicyFailClosed, time.Second)
	rdb, ctl := NewClients(Config{Addrs: []string{srv.Addr}, Timeout: time.Second}) // the gateway's clients
	t.Cleanup(func() { rdb.Close(); ctl.Close() })
	o := frozenOwner(t, srv, OwnerOptions{Client: rdb, Control: ctl, Shared: shared, GatewayTTL: 20 * time.Second})
	signal(o.beat) // a renewal now, into the frozen server
	// The liveness loop took the request: its renewal is under way.
	poll.Until(t, 10*time.Second, "a renewal asked of the frozen redis", func() bool { return len(o.beat) == 0 })
	begin := time.Now()
	o.Close()
	if took := time.Since(begin); took > closeTimeout+time.Second {
		t.Fatalf("Close took %v with redis frozen, want at most %v", took, closeTimeout+time.Second)
	}
}
