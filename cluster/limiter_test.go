package cluster

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// TestLimiterConcurrentExactlyN: 16 goroutines on one device, on
// Redis's clock: exactly N admitted, with batches decided in one script
// call (a single server) and as a pipeline of calls (Redis Cluster).
func TestLimiterConcurrentExactlyN(t *testing.T) {
	for _, multi := range []bool{true, false} {
		t.Run(map[bool]string{true: "one-call", false: "pipelined"}[multi], func(t *testing.T) {
			testConcurrentExactlyN(t, multi)
		})
	}
}

func testConcurrentExactlyN(t *testing.T, multi bool) {
	srv := redistest.Start(t)
	l, _ := newLimiter(t, srv, 20, PolicyFailClosed, time.Second)
	l.multi = multi
	q := devicelimit.Quota{Limit: 500, Window: time.Hour}
	var allowed, refused atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 100 {
				d := l.AllowAt("shared", q, 0)
				if d.Allowed {
					allowed.Add(1)
					continue
				}
				if d.RetryAfter <= 0 || d.RetryAfter > q.Window+q.Window/20 || d.Count != q.Limit {
					t.Errorf("refusal %+v: want count %d and 0 < RetryAfter <= T+T/B", d, q.Limit)
				}
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	if allowed.Load() != int64(q.Limit) || refused.Load() != 1600-int64(q.Limit) {
		t.Fatalf("allowed %d refused %d, want %d and %d", allowed.Load(), refused.Load(), q.Limit, 1600-q.Limit)
	}
	if st := l.Stats(); st.Fallbacks != 0 || !st.Up {
		t.Fatalf("stats %+v: want no fallback", st)
	}
	if d, err := l.Peek(context.Background(), "shared", q); err != nil || d.Allowed || d.Count != q.Limit {
		t.Fatalf("peek %+v %v", d, err)
	}
	if d, err := l.Peek(context.Background(), "unknown", q); err != nil || d.Allowed || d.Remaining != q.Limit {
		t.Fatalf("peek of an unknown device %+v %v: want remaining %d", d, err, q.Limit)
	}
}

// TestLimiterInvalidQuotaRefused: like the table, an invalid quota is
// refused without asking Redis.
func TestLimiterInvalidQuotaRefused(t *testing.T) {
	srv := redistest.Start(t)
	l, _ := newLimiter(t, srv, 20, PolicyFailOpen, time.Second)
	for _, q := range []devicelimit.Quota{{Limit: 0, Window: time.Second}, {Limit: 1, Window: time.Millisecond}} {
		if d := l.AllowAt("d", q, 0); d.Allowed {
			t.Fatalf("quota %v admitted", q)
		}
	}
}

// TestLimiterFailurePolicies kills redis-server mid-run: each policy
// decides as configured, no decision waits much longer than the
// timeout, the fallbacks are counted, and decisions go back to Redis
// once it runs again.
func TestLimiterFailurePolicies(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 50 * time.Millisecond
	q := devicelimit.Quota{Limit: 2, Window: time.Hour}
	type lim struct {
		l   *Limiter
		tab *devicelimit.Table
	}
	lims := map[Policy]lim{}
	for _, p := range []Policy{PolicyLocal, PolicyFailOpen, PolicyFailClosed} {
		l, tab := newLimiter(t, srv, 20, p, timeout)
		lims[p] = lim{l, tab}
		for i := range 2 { // the shared window of "d-<policy>" is full
			if d := l.AllowAt("d-"+p.String(), q, 0); !d.Allowed {
				t.Fatalf("%v: message %d refused while Redis runs: %+v", p, i, d)
			}
		}
	}
	srv.Kill()
	now := devicelimit.TickOf(time.Now())
	for p, x := range lims {
		dev := "d-" + p.String()
		var got []bool
		for range 3 {
			begin := time.Now()
			d := x.l.AllowAt(dev, q, now)
			if took := time.Since(begin); took > timeout+100*time.Millisecond {
				t.Errorf("%v: decision took %v with Redis dead, timeout %v", p, took, timeout)
			}
			got = append(got, d.Allowed)
		}
		want := map[Policy][]bool{
			PolicyLocal:      {true, true, false}, // this gateway's own window, empty until now
			PolicyFailOpen:   {true, true, true},
			PolicyFailClosed: {false, false, false},
		}[p]
		if got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
			t.Errorf("%v with Redis dead: allowed %v, want %v", p, got, want)
		}
		if st := x.l.Stats(); st.Fallbacks != 3 || st.Up {
			t.Errorf("%v: stats %+v, want 3 fallbacks and down", p, st)
		}
	}

	srv.Restart() // empty: the windows were in the killed server's memory
	for p, x := range lims {
		deadline := time.Now().Add(5 * time.Second)
		for {
			before := x.l.Stats().Fallbacks
			d := x.l.AllowAt("fresh-"+p.String(), devicelimit.Quota{Limit: 1, Window: time.Hour}, now)
			if x.l.Stats().Fallbacks == before {
				// Decided by Redis: the shared window now holds it.
				if !d.Allowed || !x.l.Stats().Up {
					t.Fatalf("%v after recovery: %+v, stats %+v", p, d, x.l.Stats())
				}
				if d2 := x.l.AllowAt("fresh-"+p.String(), devicelimit.Quota{Limit: 1, Window: time.Hour}, now); d2.Allowed {
					t.Fatalf("%v after recovery: second message of a 1/h quota admitted", p)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%v: no recovery 5s after Redis came back: %+v", p, x.l.Stats())
			}
			time.Sleep(10 * time.Millisecond) // polling for recovery
		}
	}
}

// TestLimiterSlowRedis pauses redis-server (it accepts but never
// answers): decisions take the policy within about the timeout.
func TestLimiterSlowRedis(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 30 * time.Millisecond
	l, _ := newLimiter(t, srv, 20, PolicyFailClosed, timeout)
	q := devicelimit.Quota{Limit: 100, Window: time.Hour}
	if d := l.AllowAt("d", q, 0); !d.Allowed {
		t.Fatalf("refused while Redis runs: %+v", d)
	}
	srv.Stop()
	defer srv.Cont()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 5 {
				begin := time.Now()
				d := l.AllowAt("d", q, 0)
				if took := time.Since(begin); took > timeout+100*time.Millisecond {
					t.Errorf("decision took %v with Redis paused, timeout %v", took, timeout)
				}
				if d.Allowed {
					t.Errorf("fail-closed admitted with Redis paused: %+v", d)
				}
			}
		})
	}
	wg.Wait()
	srv.Cont()
	deadline := time.Now().Add(5 * time.Second)
	for !l.AllowAt("d", q, 0).Allowed {
		if time.Now().After(deadline) {
			t.Fatalf("no recovery 5s after Redis resumed: %+v", l.Stats())
		}
		time.Sleep(10 * time.Millisecond) // polling for recovery
	}
}

// TestHealthLogsAreRateLimited: a burst of failures logs one line, the
// recovery one line with the count of fallbacks in between.
func TestHealthLogsAreRateLimited(t *testing.T) {
	var buf bytes.Buffer
	h := health{log: slog.New(slog.NewTextHandler(&buf, nil)), policy: PolicyLocal, retry: time.Hour, logEvery: 10 * time.Second, start: time.Now()}
	for range 1000 { // as decide does: the failure, then the policy's decision
		h.failed(ErrTimeout)
		h.fallbacks.Add(1)
	}
	if !h.skip() {
		t.Fatal("not resting after a failure")
	}
	h.ok()
	h.ok()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "redis unavailable") || !strings.Contains(lines[1], "redis available again") || !strings.Contains(lines[1], "fallbacks=1000") {
		t.Fatalf("log:\n%s\nwant one unavailable line and one recovery line with fallbacks=1000", buf.String())
	}
	if h.skip() {
		t.Fatal("still resting after a success")
	}
}
