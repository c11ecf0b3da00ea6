package cluster

import (
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
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
