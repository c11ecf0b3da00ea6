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
