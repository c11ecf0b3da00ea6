package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// The failure policy local's bound per outage shape, as docs/operations.md
// states it: k gateways share one Redis, a device uses one class window of
// N per T through all of them. Redis counts at most N per T in what it
// holds; each gateway's own window (never cleared when Redis comes back)
// admits at most N per T while Redis does not answer. So in any interval T:
//
//   - Redis frozen (SIGSTOP) and resumed, or killed and restarted with
//     everything it had acknowledged: (k+1) x N;
//   - each restart that empties Redis in the interval forgets up to N
//     admissions, which are admitted again: (k+1+w) x N for w empty
//     restarts, (k+2) x N for one.
//
// Each test below drives the worst case through k = 2 limiters for one
// device: the window filled in Redis through both, then an outage with
// both gateways publishing on their own windows, then Redis back and
// both publishing again. The window is an hour, so every admission of
// the test lies in one interval T (Redis's clock is its own TIME; the
// local windows take the injected now).

const outageK = 2

type outageRun struct {
	t        *testing.T
	srv      *redistest.Server
	lims     []*Limiter
	q        devicelimit.Quota
	now      devicelimit.Tick
	admitted int
}

// newOutageRun starts k limiters on srv whose calls to Redis time out
// after timeout. Redis killed refuses the connection at once, whatever
// the timeout; Redis frozen (SIGSTOP) holds every call for all of it.
// A call slower than the timeout while Redis is up is decided by the
// failure policy too, on a window of its own, and the exact counts of
// the phases with Redis no longer hold: on a loaded machine a durable
// Redis (an fsync per write) answered later than 50 ms, so the timeout
// is as long as each shape allows.
func newOutageRun(t *testing.T, srv *redistest.Server, timeout time.Duration) *outageRun {
	r := &outageRun{t: t, srv: srv, q: devicelimit.Quota{Limit: 4, Window: time.Hour},
		now: devicelimit.TickOf(time.Now())}
	for range outageK {
		l, _ := newLimiter(t, srv, 20, PolicyLocal, timeout)
		r.lims = append(r.lims, l)
	}
	return r
}

// send publishes n messages through each gateway in turn and returns
// how many were admitted.
func (r *outageRun) send(n int) int {
	got := 0
	for range n {
		for _, l := range r.lims {
			if l.AllowClassAt("d", "telemetry", r.q, 10, r.now).Allowed {
				got++
			}
		}
	}
	r.admitted += got
	return got
}

func (r *outageRun) fallbacks() uint64 {
	var n uint64
	for _, l := range r.lims {
		n += l.Stats().Fallbacks
	}
	return n
}

// recovered waits until every gateway decides on Redis again. A
// decision on another device is what retries Redis.
func (r *outageRun) recovered() {
	deadline := time.Now().Add(5 * time.Second)
	for i, l := range r.lims {
		for {
			l.AllowAt(fmt.Sprint("probe-", i), r.q, r.now)
			if l.Stats().Up {
				break
			}
			if time.Now().After(deadline) {
				r.t.Fatalf("gateway %d: no recovery 5s after Redis came back: %+v", i, l.Stats())
			}
			time.Sleep(10 * time.Millisecond) // polling for recovery
		}
	}
}

// outage runs one outage: down stops Redis from answering, up brings it
// back. Both gateways publish 2N each while it is down; it checks that
// the failure policy decided and that each gateway's own window gave at
// most N in all.
func (r *outageRun) outage(down, up func()) int {
	before := r.fallbacks()
	down()
	got := r.send(2 * r.q.Limit)
	up()
	if r.fallbacks() == before {
		r.t.Fatal("no decision followed the failure policy while Redis was down")
	}
	r.recovered()
	return got
}

// check asserts the stated bound on every admission of the run (all in
// one interval T) and logs what the worst case reached.
func (r *outageRun) check(shape string, bound int) {
	N := r.q.Limit
	if r.admitted > bound {
		r.t.Fatalf("%s: %d admitted within T through k=%d gateways, over the stated bound %d (N=%d)", shape, r.admitted, outageK, bound, N)
	}
	r.t.Logf("%s: worst case reached %d = %.1f x N of the bound %d = %d x N (k=%d)", shape, r.admitted, float64(r.admitted)/float64(N), bound, bound/N, outageK)
}

// TestLocalBoundFreeze: Redis frozen (SIGSTOP) and resumed keeps its
// windows: (k+1) x N.
func TestLocalBoundFreeze(t *testing.T) {
	// Each of the 16 decisions while Redis is frozen waits the timeout.
	r := newOutageRun(t, redistest.Start(t), 500*time.Millisecond)
	N := r.q.Limit
	if got := r.send(2 * N); got != N {
		t.Fatalf("with Redis: %d admitted, want %d", got, N)
	}
	r.outage(r.srv.Stop, r.srv.Cont)
	if got := r.send(2 * N); got != 0 {
		t.Fatalf("after Redis resumed: %d admitted, want 0 (its window is full)", got)
	}
	r.check("freeze", (outageK+1)*N)
}

// TestLocalBoundRestartWithData: Redis killed and restarted with what it
// had acknowledged (append-only file fsynced on every write): (k+1) x N.
func TestLocalBoundRestartWithData(t *testing.T) {
	r := newOutageRun(t, redistest.StartDurable(t), 5*time.Second)
	N := r.q.Limit
	if got := r.send(2 * N); got != N {
		t.Fatalf("with Redis: %d admitted, want %d", got, N)
	}
	r.outage(r.srv.Kill, r.srv.Restart)
	if d, err := r.lims[0].PeekAll(context.Background(), "d", "telemetry", r.q.Limits(), 10); err != nil || d.Decision().Count != N {
		t.Fatalf("restarted Redis holds %+v (%v), want the window's %d", d.Decision(), err, N)
	}
	if got := r.send(2 * N); got != 0 {
		t.Fatalf("after Redis restarted with its data: %d admitted, want 0", got)
	}
	r.check("restart with data", (outageK+1)*N)
}

// TestLocalBoundEmptyRestart: Redis killed and restarted empty at once
// forgets the N it had counted: (k+2) x N for one such restart, and
// each further one in the same interval adds N, (k+1+w) x N: the local
// windows are full after the first outage, Redis's is empty after every
// wipe.
func TestLocalBoundEmptyRestart(t *testing.T) {
	r := newOutageRun(t, redistest.Start(t), 5*time.Second)
	N := r.q.Limit
	if got := r.send(2 * N); got != N {
		t.Fatalf("with Redis: %d admitted, want %d", got, N)
	}
	quick := func() { r.srv.Kill(); r.srv.Restart() }
	start := time.Now()
	r.outage(r.srv.Kill, r.srv.Restart)
	t.Logf("first outage, kill to recovery: %v", time.Since(start))
	if got := r.send(2 * N); got != N {
		t.Fatalf("after the empty restart: %d admitted, want %d (the wiped window counts again)", got, N)
	}
	r.check("one empty restart", (outageK+2)*N)
	// A second wipe in the same interval: the gateways' windows are
	// already full, Redis's is empty again.
	r.outage(r.srv.Kill, r.srv.Restart)
	r.send(2 * N)
	r.check("two empty restarts", (outageK+1+2)*N)
	// A wipe no gateway sees as an outage (between decisions) still
	// forgets: N more, no local window involved.
	quick()
	r.recovered()
	r.send(2 * N)
	r.check("three empty restarts", (outageK+1+3)*N)
}
