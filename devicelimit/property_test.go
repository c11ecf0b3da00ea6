package devicelimit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// propertySequences is the number of generated arrival sequences; the
// acceptance bar is 100k in total across the property tests, run in full
// without the race detector (`make test` runs them so; under it, a
// tenth: raceScale).
const propertySequences = 70_000

func randomQuota(r *rand.Rand) (Quota, int) {
	buckets := 1 + r.IntN(100)
	// Windows of 10 ms..1 h, log-uniform, and long enough for the buckets.
	minW := max(10*ms, time.Duration(buckets)*MinBucketWidth)
	w := time.Duration(float64(minW) * math.Pow(float64(time.Hour)/float64(minW), r.Float64()))
	if r.IntN(4) == 0 {
		w = w.Round(ms) // round windows are common in config
	}
	return Quota{Limit: 1 + r.IntN(1000), Window: w}, buckets
}

// arrivals generates a sequence of ticks for quota q in one of several
// shapes: bursts, steady faster than the limit, sparse, and idle gaps
// longer than many laps of the ring.
func arrivals(r *rand.Rand, q Quota, buckets int) []Tick {
	n := 50 + r.IntN(400)
	out := make([]Tick, 0, n)
	now := t0.Add(time.Duration(r.Int64N(int64(q.Window))))
	gap := q.Window / time.Duration(buckets)
	for len(out) < n {
		switch r.IntN(6) {
		case 0: // burst at one instant
			for k := r.IntN(2 * q.Limit); k > 0 && len(out) < n; k-- {
				out = append(out, now)
			}
		case 1: // steady, about the limit's rate or faster
			period := time.Duration(float64(q.Window) / float64(q.Limit) * (0.2 + r.Float64()))
			for k := r.IntN(200); k > 0 && len(out) < n; k-- {
				now = now.Add(period)
				out = append(out, now)
			}
		case 2: // sparse
			now = now.Add(time.Duration(r.Int64N(int64(q.Window))))
			out = append(out, now)
		case 3: // idle for many laps of the ring
			now = now.Add(time.Duration(1+r.IntN(50)) * q.Window)
		case 4: // near bucket edges
			now = now.Add(gap - time.Duration(r.IntN(3)))
			out = append(out, now)
		default: // jitter within a bucket
			now = now.Add(time.Duration(r.Int64N(int64(gap) + 1)))
			out = append(out, now)
		}
	}
	return out
}

// checkWindows fails when some closed interval of length T holds more
// than N of the admitted ticks (sorted ascending).
func checkWindows(t *testing.T, admitted []Tick, q Quota, what string) {
	t.Helper()
	for i := q.Limit; i < len(admitted); i++ {
		if span := admitted[i].Sub(admitted[i-q.Limit]); span <= q.Window {
			t.Fatalf("%s: %d admissions within %v (quota %v): admissions %d..%d at +%v..+%v",
				what, q.Limit+1, span, q, i-q.Limit, i, admitted[i-q.Limit].Sub(t0), admitted[i].Sub(t0))
		}
	}
}

func TestPropertyNeverMoreThanNInAnyWindow(t *testing.T) {
	tables := tableSet{}
	var admitted []Tick
	forEachSeq(t, 1, propertySequences/raceScale, func(seq int, r *rand.Rand) {
		q, buckets := randomQuota(r)
		tab := tables.get(t, buckets)
		dev := fmt.Sprint("dev-", seq)
		admitted = admitted[:0]
		for _, at := range arrivals(r, q, buckets) {
			d := tab.AllowAt(dev, q, at)
			if d.Allowed {
				admitted = append(admitted, at)
				continue
			}
			if d.RetryAfter <= 0 || d.RetryAfter > q.Window+q.Window/time.Duration(buckets)+1 {
				t.Fatalf("seq %d quota %v buckets %d: refused with RetryAfter %v", seq, q, buckets, d.RetryAfter)
			}
			if seq%16 == 0 {
				checkRetryAfter(t, tab, dev, q, at, d.RetryAfter)
			}
		}
		checkWindows(t, admitted, q, fmt.Sprintf("seq %d buckets %d", seq, buckets))
		tab.Reset(dev)
	})
}

// checkRetryAfter copies the window to two probe devices: one message at
// now+RetryAfter is admitted, one a nanosecond earlier is not.
func checkRetryAfter(t *testing.T, tab *Table, dev string, q Quota, now Tick, retry time.Duration) {
	t.Helper()
	w, ok := tab.Snapshot(dev)
	if !ok {
		t.Fatal("no window to snapshot")
	}
	for _, probe := range []struct {
		at   Tick
		want bool
	}{{now.Add(retry - 1), false}, {now.Add(retry), true}} {
		if err := tab.Restore("probe", w); err != nil {
			t.Fatal(err)
		}
		if d := tab.AllowAt("probe", q, probe.at); d.Allowed != probe.want {
			t.Fatalf("quota %v: refused at +%v with RetryAfter %v; at +%v got allowed=%v",
				q, now.Sub(t0), retry, probe.at.Sub(t0), d.Allowed)
		}
	}
	tab.Reset("probe")
}

func TestPropertyEvenSenderNeverRefused(t *testing.T) {
	tables := tableSet{}
	forEachSeq(t, 3, (100_000-propertySequences)/raceScale, func(seq int, r *rand.Rand) {
		q, buckets := randomQuota(r)
		tab := tables.get(t, buckets)
		// N per T*(1+1/B) is a period of T*(B+1)/(B*N), rounded up to the
		// nanosecond; sometimes slower still.
		num := int64(q.Window) * int64(buckets+1)
		den := int64(buckets) * int64(q.Limit)
		period := time.Duration((num + den - 1) / den)
		if r.IntN(3) == 0 {
			period += time.Duration(r.Int64N(int64(period)))
		}
		dev := fmt.Sprint("even-", seq)
		now := t0.Add(time.Duration(r.Int64N(int64(q.Window))))
		sends := 2*q.Limit + r.IntN(3*buckets+10)
		for i := 0; i < min(sends, 3000); i++ {
			if d := tab.AllowAt(dev, q, now); !d.Allowed {
				t.Fatalf("seq %d quota %v buckets %d period %v: message %d refused: %+v", seq, q, buckets, period, i, d)
			}
			now = now.Add(period)
		}
		tab.Reset(dev)
	})
}

// A quota change mid-sequence (limit and window length both random):
// every admission made under the new quota Q2 at t saw every admission
// in (t-m, t], m the shorter of the two windows, so no such interval
// holds more than N2; and RetryAfter of a refusal under Q2 is exact.
func TestPropertyQuotaChangeKeepsCounts(t *testing.T) {
	tab := newTable(t, 20)
	forEachSeq(t, 7, 3000, func(seq int, r *rand.Rand) {
		var q [2]Quota
		for i := range q {
			q[i], _ = randomQuota(r)
			q[i].Window = max(q[i].Window, 20*MinBucketWidth)
		}
		dev := fmt.Sprint("dev-", seq)
		seq1 := arrivals(r, q[0], 20)
		seq2 := arrivals(r, q[1], 20)
		// The second part starts where the first ended.
		shift := seq1[len(seq1)-1].Sub(seq2[0]) + time.Duration(r.Int64N(int64(q[0].Window)))
		var admitted []Tick
		var second []int // indices in admitted made under q[1]
		for part, ticks := range [][]Tick{seq1, seq2} {
			for _, at := range ticks {
				if part == 1 {
					at = at.Add(shift)
				}
				d := tab.AllowAt(dev, q[part], at)
				if d.Allowed {
					if part == 1 {
						second = append(second, len(admitted))
					}
					admitted = append(admitted, at)
				} else if part == 1 && seq%8 == 0 {
					checkRetryAfter(t, tab, dev, q[1], at, d.RetryAfter)
				}
			}
		}
		m := min(q[0].Window, q[1].Window)
		for _, i := range second {
			if j := i - q[1].Limit; j >= 0 && admitted[i].Sub(admitted[j]) < m {
				t.Fatalf("seq %d, quota %v then %v: %d admissions within %v < %v, the last under the new quota",
					seq, q[0], q[1], q[1].Limit+1, admitted[i].Sub(admitted[j]), m)
			}
		}
		tab.Reset(dev)
	})
}
