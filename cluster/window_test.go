package cluster

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// t0 is a realistic instant, so the script's arithmetic runs on today's
// magnitudes (about 1.8e15 microseconds).
var t0 = devicelimit.TickOf(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))

// scriptSequences is how many random arrival sequences the property
// test runs against the script: each decision is a round trip to Redis.
const scriptSequences = 300

// TestScriptMatchesTable runs random arrival sequences (bursts, steady
// floods, sparse sends, idle gaps over many laps of the ring, bucket
// edges) through the Lua script on a real redis-server, at explicit
// microsecond times, and through devicelimit.Table at the same times:
// every decision must be the same, and no interval of length T may hold
// more than N admissions.
func TestScriptMatchesTable(t *testing.T) {
	srv := redistest.Start(t)
	r := rand.New(rand.NewPCG(7, 8))
	ctx := context.Background()
	limiters := map[int]*Limiter{}
	tables := map[int]*devicelimit.Table{}
	decisions := 0
	for seq := range scriptSequences {
		q, buckets := randomQuota(r)
		l := limiters[buckets]
		if l == nil {
			l, tables[buckets] = newLimiter(t, srv, buckets, PolicyFailClosed, time.Second)
			limiters[buckets] = l
		}
		tab := tables[buckets]
		dev := fmt.Sprint("dev-", seq)
		var admitted []devicelimit.Tick
		seqArrivals := arrivals(r, q, buckets)
		recutAt, q2 := -1, q
		if seq%4 == 0 { // a quota change mid-sequence re-cuts the window
			recutAt = len(seqArrivals) / 2
			q2, _ = randomQuota(r)
			q2.Window = max(q2.Window, time.Duration(buckets)*10*time.Millisecond)
		}
		for i, at := range seqArrivals {
			if i == recutAt {
				checkWindows(t, admitted, q, fmt.Sprintf("seq %d buckets %d before re-cut", seq, buckets))
				q, admitted = q2, admitted[:0]
			}
			count := i%7 != 3 // some peeks among the decisions
			got, err := l.evalAt(ctx, dev, q, count, int64(at)/1000)
			if err != nil {
				t.Fatalf("seq %d: %v", seq, err)
			}
			var want devicelimit.Decision
			if count {
				want = tab.AllowAt(dev, q, at)
			} else {
				want = tab.PeekAt(dev, q, at)
			}
			// The table's first tick of a bucket may fall between two
			// microseconds; the script's is the next whole microsecond.
			// So may the instant a re-cut window is decided at: RetryAfter
			// may then differ by that microsecond.
			if r := want.RetryAfter % time.Microsecond; r != 0 {
				want.RetryAfter += time.Microsecond - r
			}
			// A refusal read from the header alone reports the count
			// when the window filled, not after buckets expired since.
			if count && !got.Allowed && !want.Allowed && got.Count >= want.Count && got.Count >= q.Limit {
				got.Count = want.Count
			}
			if diff := got.RetryAfter - want.RetryAfter; diff == time.Microsecond || diff == -time.Microsecond {
				got.RetryAfter = want.RetryAfter
			}
			// After a re-cut the table (nanoseconds) and the script
			// (microseconds) may move the counts to neighbouring buckets:
			// both safe, not equal. The invariant is checked still.
			if exact := recutAt < 0 || i < recutAt; exact && got != want {
				t.Fatalf("seq %d quota %v buckets %d decision %d at +%v (count=%v): script %+v, table %+v",
					seq, q, buckets, i, at.Sub(t0), count, got, want)
			}
			decisions++
			if got.Allowed {
				admitted = append(admitted, at)
			}
		}
		checkWindows(t, admitted, q, fmt.Sprintf("seq %d buckets %d", seq, buckets))
		tab.Reset(dev)
	}
	t.Logf("%d sequences, %d decisions, equal to devicelimit.Table's up to any re-cut, invariant held throughout", scriptSequences, decisions)
}

// randomQuota returns a quota of whole milliseconds (the script counts
// whole microseconds) and a bucket count; most limits need 1-byte
// counters, some 2 or 4 bytes.
func randomQuota(r *rand.Rand) (devicelimit.Quota, int) {
	buckets := 1 + r.IntN(100)
	minW := max(10*time.Millisecond, time.Duration(buckets)*devicelimit.MinBucketWidth)
	w := time.Duration(float64(minW) * math.Pow(float64(time.Hour)/float64(minW), r.Float64()))
	limit := 1 + r.IntN(60)
	if r.IntN(5) == 0 { // 2- and 4-byte counters, and widening on a re-cut
		limit = []int{300, 70_000}[r.IntN(2)]
	}
	return devicelimit.Quota{Limit: limit, Window: w.Round(time.Millisecond)}, buckets
}

// arrivals generates whole-microsecond ticks in several shapes.
func arrivals(r *rand.Rand, q devicelimit.Quota, buckets int) []devicelimit.Tick {
	n := 30 + r.IntN(150)
	out := make([]devicelimit.Tick, 0, n)
	us := func(d time.Duration) time.Duration { return d.Truncate(time.Microsecond) }
	now := t0.Add(us(time.Duration(r.Int64N(int64(q.Window)))))
	gap := q.Window / time.Duration(buckets)
	for len(out) < n {
		switch r.IntN(6) {
		case 0: // burst at one instant
			for k := r.IntN(2 * q.Limit); k > 0 && len(out) < n; k-- {
				out = append(out, now)
			}
		case 1: // steady, about the limit's rate or faster
			period := us(time.Duration(float64(q.Window) / float64(q.Limit) * (0.2 + r.Float64())))
			for k := r.IntN(100); k > 0 && len(out) < n; k-- {
				now = now.Add(period)
				out = append(out, now)
			}
		case 2: // sparse
			now = now.Add(us(time.Duration(r.Int64N(int64(q.Window)))))
			out = append(out, now)
		case 3: // idle for many laps of the ring
			now = now.Add(time.Duration(1+r.IntN(50)) * q.Window)
		case 4: // near bucket edges
			now = now.Add(us(gap) - time.Duration(r.IntN(3))*time.Microsecond)
			out = append(out, now)
		default: // jitter within a bucket
			now = now.Add(us(time.Duration(r.Int64N(int64(gap) + 1))))
			out = append(out, now)
		}
	}
	return out
}

// checkWindows fails when some closed interval of length T holds more
// than N of the admitted ticks (sorted ascending).
func checkWindows(t *testing.T, admitted []devicelimit.Tick, q devicelimit.Quota, what string) {
	t.Helper()
	for i := q.Limit; i < len(admitted); i++ {
		if span := admitted[i].Sub(admitted[i-q.Limit]); span <= q.Window {
			t.Fatalf("%s: %d admissions within %v (quota %v)", what, q.Limit+1, span, q)
		}
	}
}

// TestScriptClockStepBack: a Redis clock stepped back cannot empty a
// window; the window's high-water keeps its counts.
func TestScriptClockStepBack(t *testing.T) {
	srv := redistest.Start(t)
	l, _ := newLimiter(t, srv, 10, PolicyFailClosed, time.Second)
	ctx := context.Background()
	q := devicelimit.Quota{Limit: 3, Window: 10 * time.Second}
	at := int64(t0) / 1000
	for i := range 3 {
		if d, err := l.evalAt(ctx, "d", q, true, at); err != nil || !d.Allowed {
			t.Fatalf("message %d: %+v, %v", i, d, err)
		}
	}
	for _, back := range []time.Duration{time.Second, time.Minute, 24 * time.Hour} {
		d, err := l.evalAt(ctx, "d", q, true, at-back.Microseconds())
		if err != nil || d.Allowed || d.Count != 3 {
			t.Fatalf("clock %v back: got %+v, %v; want refused with count 3", back, d, err)
		}
	}
	// Forward again, past the window: admitted.
	if d, err := l.evalAt(ctx, "d", q, true, at+(11*time.Second).Microseconds()); err != nil || !d.Allowed {
		t.Fatalf("after the window: %+v, %v", d, err)
	}
}

// TestScriptKeyExpires: a window's key lives until its newest bucket
// leaves the window, about T, and holds a compact record.
func TestScriptKeyExpires(t *testing.T) {
	srv := redistest.Start(t)
	l, _ := newLimiter(t, srv, 20, PolicyFailClosed, time.Second)
	q := devicelimit.Quota{Limit: 100, Window: 10 * time.Second}
	if d := l.AllowAt("dev-1", q, 0); !d.Allowed {
		t.Fatalf("first message refused: %+v", d)
	}
	c := srv.Client()
	key := l.windowKey("dev-1")
	ttl, err := c.PTTL(context.Background(), key).Result()
	if err != nil || ttl <= q.Window-time.Second || ttl > q.Window+q.Window/20+time.Millisecond {
		t.Fatalf("PTTL %s = %v, %v; want about %v", key, ttl, err, q.Window)
	}
	n, err := c.StrLen(context.Background(), key).Result()
	if err != nil || n != 43+21 {
		t.Fatalf("record is %d bytes (%v), want %d", n, err, 43+21)
	}
	if key != "devicegate:w:{dev-1}" {
		t.Fatalf("key %q: want the device as hash tag", key)
	}
}

// TestScriptCounterWidths: counters are 1, 2 or 4 bytes as the limit
// needs, widened in place when a larger limit comes; counts above 255
// and 65535 in one bucket stay exact, decision by decision equal to the
// table's.
func TestScriptCounterWidths(t *testing.T) {
	srv := redistest.Start(t)
	l, tab := newLimiter(t, srv, 20, PolicyFailClosed, time.Second)
	ctx := context.Background()
	c := srv.Client()
	at := t0.Add(123 * time.Millisecond)
	n := 0
	for _, step := range []struct {
		limit, sends, width int
	}{{200, 210, 1}, {1000, 810, 2}, {70_000, 69_100, 4}} {
		q := devicelimit.Quota{Limit: step.limit, Window: time.Hour}
		for i := range step.sends {
			got, err := l.evalAt(ctx, "wide", q, true, int64(at)/1000)
			if err != nil {
				t.Fatal(err)
			}
			want := tab.AllowAt("wide", q, at)
			if !got.Allowed && !want.Allowed && got.Count >= want.Count {
				got.Count = want.Count // a refusal from the header alone
			}
			if got != want {
				t.Fatalf("limit %d send %d: script %+v, table %+v", step.limit, i, got, want)
			}
			n++
			at = at.Add(time.Microsecond)
		}
		size, err := c.StrLen(ctx, l.windowKey("wide")).Result()
		if err != nil || size != int64(43+21*step.width) {
			t.Fatalf("limit %d: record of %d bytes (%v), want %d-byte counters", step.limit, size, err, step.width)
		}
	}
	t.Logf("%d decisions equal to the table's", n)
}
