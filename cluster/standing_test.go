package cluster

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/devicelimit/standingtest"
)

// redisBackend runs standingtest cases on a limiter's shared windows at
// explicit microsecond instants (Redis's own clock cannot be moved).
type redisBackend struct {
	t testing.TB
	l *Limiter
}

func (b redisBackend) Allow(c *standingtest.Case, size int, at devicelimit.Tick) bool {
	ctx, clock := context.Background(), int64(at)/1000
	if c.GroupKey != "" {
		d, err := b.l.evalGroupAt(ctx, c.Device, c.Class, c.Q, c.GroupKey, c.GQ, size, clock)
		if err != nil {
			b.t.Fatal(err)
		}
		return d.Allowed
	}
	if _, tooLarge := devicelimit.TooLargeVerdict(c.Q.Limits(), size); tooLarge {
		return false // decided without Redis (Limiter.precheck)
	}
	v, err := b.l.evalAllAt(ctx, c.Device, c.Class, c.Q.Limits(), size, true, clock)
	if err != nil {
		b.t.Fatal(err)
	}
	return v.Allowed
}

func (b redisBackend) Standing(c *standingtest.Case, size int, refused bool, at devicelimit.Tick, s *devicelimit.Standing) {
	s.N = 0
	if err := b.l.standingAt(context.Background(), c.Device, c.Class, c.Q, c.GroupKey, c.GQ, size, refused, int64(at)/1000, s); err != nil {
		b.t.Fatal(err)
	}
}

// TestStandingPromiseRedis is devicelimit's TestStandingPromise on
// windows shared in a real redis-server.
func TestStandingPromiseRedis(t *testing.T) {
	srv := redistest.Start(t)
	limiters := map[int]*Limiter{}
	report, err := standingtest.Run(34, 60, t0, func(buckets int) standingtest.Backend {
		if limiters[buckets] == nil {
			limiters[buckets], _ = newLimiter(t, srv, buckets, PolicyFailClosed, time.Second)
		}
		return redisBackend{t, limiters[buckets]}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(report)
}

// TestStandingMatchesTable: the standing read in Redis is the table's
// at the same instants, after the same decisions, r exactly and t to
// the microsecond.
func TestStandingMatchesTable(t *testing.T) {
	srv := redistest.Start(t)
	r := rand.New(rand.NewPCG(34, 1))
	limiters := map[int]*Limiter{}
	for i := range 100 {
		c := standingtest.RandomCase(r, i%standingtest.Kinds, "match-"+string(rune('a'+i%26))+string(rune('a'+i/26)), t0)
		if limiters[c.Buckets] == nil {
			limiters[c.Buckets], _ = newLimiter(t, srv, c.Buckets, PolicyFailClosed, time.Second)
		}
		tab, err := devicelimit.NewTable(c.Buckets)
		if err != nil {
			t.Fatal(err)
		}
		rb, tb := redisBackend{t, limiters[c.Buckets]}, standingtest.TableBackend{Table: tab}
		for _, m := range c.History {
			if a, b := rb.Allow(&c, m.Size, m.At), tb.Allow(&c, m.Size, m.At); a != b {
				t.Fatalf("case %d: redis allowed %v, table %v at %v size %d (%+v)", i, a, b, m.At, m.Size, c)
			}
		}
		refused := !rb.Allow(&c, c.LookSize, c.LookAt)
		tb.Allow(&c, c.LookSize, c.LookAt)
		var rs, ts devicelimit.Standing
		rb.Standing(&c, c.LookSize, refused, c.LookAt, &rs)
		tb.Standing(&c, c.LookSize, refused, c.LookAt, &ts)
		if rs.N != ts.N {
			t.Fatalf("case %d: redis %d windows, table %d", i, rs.N, ts.N)
		}
		for k := range rs.N {
			a, b := rs.Windows[k], ts.Windows[k]
			if d := a.Reset - b.Reset; d < -time.Microsecond || d > time.Microsecond {
				t.Fatalf("case %d window %d: redis %+v, table %+v", i, k, a, b)
			}
			a.Reset = b.Reset
			if a != b {
				t.Fatalf("case %d window %d: redis %+v, table %+v", i, k, a, b)
			}
		}
	}
}
