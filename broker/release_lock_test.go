package broker

import (
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// gateLimiter is the table, except that a decision for device blocks
// until open is closed, as a Redis round trip at its timeout would.
type gateLimiter struct {
	*devicelimit.Table
	device  string
	entered chan struct{}
	open    chan struct{}
}

func (g *gateLimiter) AllowAt(device string, q devicelimit.Quota, now devicelimit.Tick) devicelimit.Decision {
	g.wait(device)
	return g.Table.AllowAt(device, q, now)
}

// AllowClassAt is the broker's decision: gated like AllowAt.
func (g *gateLimiter) AllowClassAt(device, class string, q devicelimit.Quota, size int, now devicelimit.Tick) devicelimit.Decision {
	g.wait(device)
	return g.Table.AllowClassAt(device, class, q, size, now)
}

// wait holds a decision on the gated device until the gate opens.
func (g *gateLimiter) wait(device string) {
	if device == g.device {
		select {
		case g.entered <- struct{}{}:
		default:
		}
		<-g.open
	}
}

// A release round decides outside the shard lock: while one device's
// decision waits on a slow limiter, another device of the same shard can
// still queue and be looked at.
func TestReleaseDecidesOutsideShardLock(t *testing.T) {
	gate := newGate("slow")
	f := startGated(t, gate, fixtureOpts{})
	d := f.srv.def
	other := sameShard(d, "slow")
	q := devicelimit.Quota{Limit: 5, Window: time.Second, Policy: devicelimit.PolicyDefer}
	now := f.clock.Now()
	d.queueForTest("slow", q, 1, now, now, false)

	done := make(chan struct{})
	go func() { defer close(done); f.srv.releaseTick(now) }()
	<-gate.entered // the round is inside the slow decision

	looked := make(chan int)
	go func() { looked <- d.queueLen(other) }()
	select {
	case n := <-looked:
		if n != 0 {
			t.Errorf("queue of %s: %d, want 0", other, n)
		}
	case <-time.After(5 * time.Second):
		close(gate.open)
		<-done
		t.Fatalf("the shard of %q stayed locked while a release decision for %q waited", other, "slow")
	}
	close(gate.open)
	<-done
	if got := f.srv.Stats().Released; got != 1 {
		t.Fatalf("released %d, want 1", got)
	}
}
