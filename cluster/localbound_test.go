package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// TestLocalPolicyBound measures what docs/operations.md states for the failure
// policy local: a gateway's own window does not hold what Redis
// admitted, and Redis does not learn what the gateway admitted while it
// was down. A device on one gateway (k = 1) gets N from Redis, N more
// from the gateway's window when Redis stops answering, and none when
// Redis is back with its window intact: (k+1) x N in less than T, not
// more.
func TestLocalPolicyBound(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 50 * time.Millisecond
	l, _ := newLimiter(t, srv, 20, PolicyLocal, timeout)
	q := devicelimit.Quota{Limit: 5, Window: time.Hour}
	now := devicelimit.TickOf(time.Now())
	admitted := 0
	send := func(n int) {
		for range n {
			if l.AllowAt("d", q, now).Allowed {
				admitted++
			}
		}
	}
	send(2 * q.Limit) // Redis answers: N admitted
	if admitted != q.Limit || l.Stats().Fallbacks != 0 {
		t.Fatalf("with Redis: %d admitted, stats %+v; want %d and no fallback", admitted, l.Stats(), q.Limit)
	}
	srv.Stop()
	send(2 * q.Limit) // the gateway's own window, empty
	srv.Cont()
	if admitted != 2*q.Limit {
		t.Fatalf("after Redis stopped answering: %d admitted in all, want %d", admitted, 2*q.Limit)
	}
	deadline := time.Now().Add(5 * time.Second)
	// A decision on another device is what retries Redis; the look at
	// d's window asks Redis directly.
	for {
		l.AllowAt("probe", q, now)
		if d, err := l.Peek(context.Background(), "d", q); l.Stats().Up && err == nil && d.Count == q.Limit {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery 5s after Redis resumed: %+v", l.Stats())
		}
		time.Sleep(10 * time.Millisecond) // polling for recovery
	}
	before := l.Stats().Fallbacks
	send(2 * q.Limit) // Redis again, its window still full
	if admitted != 2*q.Limit || l.Stats().Fallbacks != before {
		t.Fatalf("after recovery: %d admitted in all (stats %+v), want %d decided by Redis", admitted, l.Stats(), 2*q.Limit)
	}
}
