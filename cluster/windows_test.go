package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// windowSequences is how many random sequences of several windows the
// script runs against the table: each decision is a round trip.
const windowSequences = 400

// TestScriptWindowsMatchTable runs random quotas of 1 to 4 windows
// mixing messages and bytes, in the device's own quota or a topic
// class, with random payload sizes and arrival shapes, through the Lua
// script on a real redis-server at explicit microsecond times and
// through devicelimit.Table's AllowAllAt/PeekAllAt at the same times:
// every verdict must be the same, window by window, and in no interval
// of a window's length may the admitted messages hold more than its
// limit of messages or bytes.
func TestScriptWindowsMatchTable(t *testing.T) {
	srv := redistest.Start(t)
	r := rand.New(rand.NewPCG(17, 18))
	ctx := context.Background()
	limiters := map[int]*Limiter{}
	tables := map[int]*devicelimit.Table{}
	decisions, refused, tooLarge := 0, 0, 0
	for seq := range windowSequences {
		buckets := 1 + r.IntN(40)
		ls := randomLimits(r, buckets)
		l := limiters[buckets]
		if l == nil {
			l, tables[buckets] = newLimiter(t, srv, buckets, PolicyFailClosed, time.Second)
			limiters[buckets] = l
		}
		tab := tables[buckets]
		dev, class := fmt.Sprint("dev-", seq), ""
		if seq%3 == 1 {
			class = "alarms"
		}
		shortest := ls[0]
		for _, w := range ls {
			if w.Window < shortest.Window {
				shortest = w
			}
		}
		pace := devicelimit.Quota{Limit: min(shortest.N, 40), Window: shortest.Window}
		admitted := make([][]sent, len(ls))
		for i, at := range arrivals(r, pace, buckets) {
			size := randomSize(r, ls)
			count := i%7 != 3 // some peeks among the decisions
			got, err := l.evalAllAt(ctx, dev, class, ls, size, count, int64(at)/1000)
			var want devicelimit.Verdict
			if count {
				want = tab.AllowAllAt(dev, class, ls, size, at)
			} else {
				want = tab.PeekAllAt(dev, class, ls, size, at)
			}
			if want.TooLarge {
				// The limiter says so without asking Redis.
				if d := l.decide(dev, class, ls, size, at); !d.TooLarge || d.Allowed {
					t.Fatalf("seq %d: a payload of %d bytes under %v: %+v, want too large", seq, size, ls, d)
				}
				tooLarge++
				continue
			}
			if err != nil {
				t.Fatalf("seq %d: %v", seq, err)
			}
			normalize(&got, &want, count)
			if got != want {
				t.Fatalf("seq %d windows %v class %q buckets %d decision %d at +%v (count=%v, %d bytes):\nscript %+v\ntable  %+v",
					seq, ls, class, buckets, i, at.Sub(t0), count, size, got, want)
			}
			decisions++
			if !got.Allowed {
				refused++
			}
			if got.Allowed && count {
				for k, w := range ls {
					admitted[k] = append(admitted[k], sent{at, w.Units(size)})
				}
			}
		}
		for k, w := range ls {
			checkSum(t, admitted[k], w, fmt.Sprintf("seq %d window %d", seq, k))
		}
	}
	if refused == 0 || refused == decisions || tooLarge == 0 {
		t.Fatalf("%d decisions, %d refused, %d too large: the sequences do not exercise refusals", decisions, refused, tooLarge)
	}
	t.Logf("%d sequences, %d verdicts equal to devicelimit.Table's (%d refused), %d too large; every window's invariant held", windowSequences, decisions, refused, tooLarge)
}

// normalize forgives the two differences that are not decisions: the
// script's first tick of a bucket is a whole microsecond (the table's
// may fall between two), and a refusal read from the header alone
// reports the count when the window filled.
func normalize(got, want *devicelimit.Verdict, count bool) {
	up := func(d time.Duration) time.Duration {
		if r := d % time.Microsecond; r != 0 {
			return d + time.Microsecond - r
		}
		return d
	}
	want.RetryAfter = up(want.RetryAfter)
	for i := range want.N {
		g, w := &got.Windows[i], &want.Windows[i]
		w.RetryAfter = up(w.RetryAfter)
		if count && g.RetryAfter > 0 && w.RetryAfter > 0 && g.Count >= w.Count && g.Count >= w.Limit {
			g.Count = w.Count
		}
	}
}

// randomLimits returns 1 to 4 windows of whole milliseconds, messages
// or bytes, valid for the bucket count.
func randomLimits(r *rand.Rand, buckets int) []devicelimit.Limit {
	ls := make([]devicelimit.Limit, 1+r.IntN(devicelimit.MaxWindows))
	minW := max(10*time.Millisecond, time.Duration(buckets)*devicelimit.MinBucketWidth)
	for i := range ls {
		w := minW * time.Duration(1+r.IntN(200))
		if r.IntN(2) == 0 {
			ls[i] = devicelimit.Limit{Unit: devicelimit.Messages, N: 1 + r.IntN(50), Window: w}
		} else {
			ls[i] = devicelimit.Limit{Unit: devicelimit.Bytes, N: 1 + r.IntN(5000), Window: w}
		}
		if r.IntN(8) == 0 { // 2- and 4-byte counters
			ls[i].N = []int{300, 70_000}[r.IntN(2)]
		}
	}
	return ls
}

// randomSize returns a payload size: mostly small against the byte
// windows, sometimes empty, now and then larger than one of them.
func randomSize(r *rand.Rand, ls []devicelimit.Limit) int {
	smallest := 0
	for _, w := range ls {
		if w.Unit == devicelimit.Bytes && (smallest == 0 || w.N < smallest) {
			smallest = w.N
		}
	}
	switch {
	case smallest == 0 || r.IntN(10) == 0:
		return r.IntN(3)
	case r.IntN(100) == 0:
		return smallest + 1 + r.IntN(10)
	}
	return r.IntN(smallest/4 + 1)
}

type sent struct {
	at    devicelimit.Tick
	units int
}

// checkSum fails when some closed interval of w's length holds more
// than w.N units of the admitted messages (sorted ascending).
func checkSum(t *testing.T, admitted []sent, w devicelimit.Limit, what string) {
	t.Helper()
	sum, lo := 0, 0
	for _, s := range admitted {
		sum += s.units
		for admitted[lo].at < s.at.Add(-w.Window) {
			sum -= admitted[lo].units
			lo++
		}
		if sum > w.N {
			t.Fatalf("%s: %d %s within %v before +%v (limit %v)", what, sum, w.Unit, w.Window, s.at.Sub(t0), w)
		}
	}
}

// TestLimiterWindowsConcurrent: 16 goroutines on devices of several
// windows and a topic class, on Redis's clock, batched in one script
// call and as a pipeline: each device gets exactly what its tightest
// window allows, counted in every window, and Reset empties them all.
func TestLimiterWindowsConcurrent(t *testing.T) {
	for _, multi := range []bool{true, false} {
		t.Run(map[bool]string{true: "one-call", false: "pipelined"}[multi], func(t *testing.T) {
			srv := redistest.Start(t)
			l, _ := newLimiter(t, srv, 20, PolicyFailClosed, time.Second)
			l.multi = multi
			// 50-byte messages: 5 by the message window, 6 by bytes.
			own := devicelimit.WithWindows(devicelimit.PolicyDrop,
				devicelimit.Limit{N: 5, Window: time.Hour}, devicelimit.Limit{Unit: devicelimit.Bytes, N: 300, Window: time.Hour})
			// 30-byte messages in the class: 3 by bytes, 10 by messages.
			alarms := devicelimit.WithWindows(devicelimit.PolicyDrop,
				devicelimit.Limit{Unit: devicelimit.Bytes, N: 100, Window: time.Hour}, devicelimit.Limit{N: 10, Window: time.Hour})
			var ownOK, classOK atomic.Int64
			var wg sync.WaitGroup
			for g := range 16 {
				wg.Go(func() {
					for i := range 40 {
						dev := fmt.Sprint("dev-", (g+i)%8)
						if d := l.AllowClassAt(dev, "", own, 50, 0); d.Allowed {
							ownOK.Add(1)
						} else if d.RetryAfter <= 0 || d.TooLarge {
							t.Errorf("refusal %+v: want a retry-after", d)
						}
						if d := l.AllowClassAt(dev, "alarms", alarms, 30, 0); d.Allowed {
							classOK.Add(1)
						} else if d.Unit != devicelimit.Bytes {
							t.Errorf("class refusal %+v: want the byte window's", d)
						}
					}
				})
			}
			wg.Wait()
			if ownOK.Load() != 8*5 || classOK.Load() != 8*3 {
				t.Fatalf("admitted %d own and %d alarms, want %d and %d", ownOK.Load(), classOK.Load(), 8*5, 8*3)
			}
			if d := l.AllowClassAt("dev-0", "", own, 301, 0); !d.TooLarge || d.Allowed {
				t.Fatalf("301 bytes under a 300-byte window: %+v, want too large", d)
			}
			ctx := context.Background()
			v, err := l.PeekAll(ctx, "dev-0", "", own.Windows[:2], 50)
			if err != nil || v.Allowed || v.Windows[0].Count != 5 || v.Windows[1].Count != 250 {
				t.Fatalf("peek %+v, %v: want 5 messages and 250 bytes", v, err)
			}
			if had, err := l.Reset(ctx, "dev-0", []string{"alarms"}); !had || err != nil {
				t.Fatalf("reset: %v, %v", had, err)
			}
			for _, c := range []struct {
				class string
				q     devicelimit.Quota
			}{{"", own}, {"alarms", alarms}} {
				v, err := l.PeekAll(ctx, "dev-0", c.class, c.q.Windows[:2], 0)
				if err != nil || v.Windows[0].Count != 0 || v.Windows[1].Count != 0 {
					t.Fatalf("class %q after reset: %+v, %v", c.class, v, err)
				}
			}
			if st := l.Stats(); st.Fallbacks != 0 {
				t.Fatalf("stats %+v: want no fallback", st)
			}
		})
	}
}
