package devicelimit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// multiSequences is the number of generated sequences of the several-
// windows property tests (TestPropertyAllWindowsHold and
// TestPropertyEvenSenderUnderEveryWindow: 100,000 together; a tenth
// under the race detector, see race_test.go).
const multiSequences = 60_000

// randomLimits returns 1 to 4 windows mixing messages and bytes, all
// valid for buckets.
func randomLimits(r *rand.Rand, buckets int) []Limit {
	ls := make([]Limit, 1+r.IntN(MaxWindows))
	minW := max(10*ms, time.Duration(buckets)*MinBucketWidth)
	for i := range ls {
		w := time.Duration(float64(minW) * math.Pow(float64(time.Hour)/float64(minW), r.Float64()))
		if r.IntN(2) == 0 {
			ls[i] = Limit{Unit: Messages, N: 1 + r.IntN(200), Window: w}
		} else {
			ls[i] = Limit{Unit: Bytes, N: 1 + r.IntN(20_000), Window: w}
		}
	}
	return ls
}

// tableSet holds a table per bucket count.
type tableSet map[int]*Table

func (ts tableSet) get(t *testing.T, buckets int) *Table {
	if ts[buckets] == nil {
		ts[buckets] = newTable(t, buckets)
	}
	return ts[buckets]
}

type sent struct {
	at   Tick
	size int
}

// multiArrivals generates messages with random sizes in the shapes of
// arrivals (bursts, steady, sparse, idle, bucket edges), paced by the
// shortest window.
func multiArrivals(r *rand.Rand, ls []Limit, buckets int) []sent {
	shortest := ls[0]
	for _, l := range ls {
		if l.Window < shortest.Window {
			shortest = l
		}
	}
	maxSize := 1 + r.IntN(3000)
	var out []sent
	for _, at := range arrivals(r, Quota{Limit: min(shortest.N, 200), Window: shortest.Window}, buckets) {
		out = append(out, sent{at, r.IntN(maxSize + 1)})
	}
	return out
}

// checkLimit fails when some closed interval of length l.Window holds
// more than l.N messages (or bytes) of the admitted ones (in time order).
func checkLimit(t *testing.T, admitted []sent, l Limit, what string) {
	t.Helper()
	sum, lo := 0, 0
	for hi, m := range admitted {
		if l.Unit == Bytes {
			sum += m.size
		} else {
			sum++
		}
		for admitted[hi].at.Sub(admitted[lo].at) > l.Window {
			if l.Unit == Bytes {
				sum -= admitted[lo].size
			} else {
				sum--
			}
			lo++
		}
		if sum > l.N {
			t.Fatalf("%s: %d within %v under %v (admissions %d..%d)", what, sum, admitted[hi].at.Sub(admitted[lo].at), l, lo, hi)
		}
	}
}

// TestPropertyAllWindowsHold: for random quotas of 1 to 4 windows
// mixing messages and bytes, random sizes and arrival shapes, no window
// ever holds more than its limit in any interval of its length; a
// refusal's RetryAfter is exact (the windows admit the message then,
// not a nanosecond before), and a message larger than a byte window is
// refused as too large.
func TestPropertyAllWindowsHold(t *testing.T) {
	tables := tableSet{}
	forEachSeq(t, 11, multiSequences/raceScale, func(seq int, r *rand.Rand) {
		buckets := 1 + r.IntN(40)
		tab := tables.get(t, buckets)
		ls := randomLimits(r, buckets)
		dev := fmt.Sprint("dev-", seq)
		var admitted []sent
		for _, m := range multiArrivals(r, ls, buckets) {
			v := tab.AllowAllAt(dev, "", ls, m.size, m.at)
			if v.Allowed {
				admitted = append(admitted, m)
				continue
			}
			tooLarge := false
			for _, l := range ls {
				tooLarge = tooLarge || l.Unit == Bytes && m.size > l.N
			}
			if v.TooLarge != tooLarge {
				t.Fatalf("seq %d %v: size %d: TooLarge %v", seq, ls, m.size, v.TooLarge)
			}
			if !tooLarge && (v.RetryAfter <= 0 || seq%8 == 0 && !retryExact(tab, dev, ls, m, v.RetryAfter)) {
				t.Fatalf("seq %d %v buckets %d: size %d refused at +%v with RetryAfter %v, not exact", seq, ls, buckets, m.size, m.at.Sub(t0), v.RetryAfter)
			}
		}
		for _, l := range ls {
			checkLimit(t, admitted, l, fmt.Sprintf("seq %d %v buckets %d", seq, ls, buckets))
		}
		resetAll(tab, dev, ls)
	})
}

// retryExact reports whether the windows admit m at +retry and not a
// nanosecond before.
func retryExact(tab *Table, dev string, ls []Limit, m sent, retry time.Duration) bool {
	return !tab.PeekAllAt(dev, "", ls, m.size, m.at.Add(retry-1)).Allowed && tab.PeekAllAt(dev, "", ls, m.size, m.at.Add(retry)).Allowed
}

// resetAll removes a device's windows.
func resetAll(tab *Table, dev string, ls []Limit) {
	var seen [2]int
	for _, l := range ls {
		s, _ := tab.shard(dev)
		s.mu.Lock()
		key := string([]byte(s.windowKey(dev, "", l.Unit, seen[l.Unit])))
		s.mu.Unlock()
		seen[l.Unit]++
		tab.Reset(key)
	}
}

// TestPropertyEvenSenderUnderEveryWindow: a device sending messages of
// one size evenly, no faster than every window allows with the bucket
// margin (N per T*(1+1/B), in messages or bytes), is never refused.
func TestPropertyEvenSenderUnderEveryWindow(t *testing.T) {
	tables := tableSet{}
	forEachSeq(t, 13, (100_000-multiSequences)/raceScale, func(seq int, r *rand.Rand) {
		buckets := 1 + r.IntN(40)
		tab := tables.get(t, buckets)
		ls := randomLimits(r, buckets)
		size := r.IntN(200)
		var period time.Duration
		for _, l := range ls {
			n := int64(l.N)
			if l.Unit == Bytes {
				if size == 0 {
					continue
				}
				n = int64(l.N / size)
				if n == 0 {
					size = l.N // the largest that fits
					n = 1
				}
			}
			num := int64(l.Window) * int64(buckets+1)
			den := int64(buckets) * n
			period = max(period, time.Duration((num+den-1)/den))
		}
		dev := fmt.Sprint("even-", seq)
		now := t0.Add(time.Duration(r.Int64N(int64(time.Hour))))
		for i := range 300 {
			if v := tab.AllowAllAt(dev, "", ls, size, now); !v.Allowed {
				t.Fatalf("seq %d %v buckets %d size %d period %v: message %d refused: %+v", seq, ls, buckets, size, period, i, v)
			}
			now = now.Add(period)
		}
		resetAll(tab, dev, ls)
	})
}

// TestStepsTwoWindows: 10 per 1 s and 30 per 10 s, 10 buckets each, at
// fixed instants. A message's count leaves a window B+1 buckets after its
// bucket began (window.go): 1.1 s and 11 s here.
func TestStepsTwoWindows(t *testing.T) {
	tab := newTable(t, 10)
	ls := []Limit{{Messages, 10, time.Second}, {Messages, 30, 10 * time.Second}}
	steps := []struct {
		at      time.Duration
		n       int // messages sent at at
		allowed bool
		retry   time.Duration // of the last one, when refused
		refused int
		counts  [2]int // the windows' counts after the last
	}{
		{0, 10, true, 0, -1, [2]int{10, 10}},
		{0, 1, false, 1100 * ms, 0, [2]int{10, 10}},
		{1099 * ms, 1, false, 1 * ms, 0, [2]int{10, 10}},
		{1100 * ms, 10, true, 0, -1, [2]int{10, 20}},
		{2200 * ms, 10, true, 0, -1, [2]int{10, 30}},
		{3300 * ms, 1, false, 7700 * ms, 1, [2]int{0, 30}},
		{10999 * ms, 1, false, 1 * ms, 1, [2]int{0, 30}},
		{11 * time.Second, 1, true, 0, -1, [2]int{1, 21}},
	}
	for _, s := range steps {
		var v Verdict
		for range s.n {
			v = tab.AllowAllAt("meter", "", ls, 0, t0.Add(s.at))
		}
		if v.Allowed != s.allowed || v.RetryAfter != s.retry || v.Refused != s.refused || v.Windows[0].Count != s.counts[0] || v.Windows[1].Count != s.counts[1] {
			t.Fatalf("at +%v: %+v; want allowed %v retry %v refused %d counts %v", s.at, v, s.allowed, s.retry, s.refused, s.counts)
		}
	}
}

// TestStepsByteWindow: 1000 bytes per 1 s beside 100 messages per 1 s,
// 10 buckets: sizes add up, a refusal waits until enough bytes expired,
// and a message larger than the window is refused as too large.
func TestStepsByteWindow(t *testing.T) {
	tab := newTable(t, 10)
	ls := []Limit{{Messages, 100, time.Second}, {Bytes, 1000, time.Second}}
	for _, s := range []struct {
		at       time.Duration
		size     int
		allowed  bool
		retry    time.Duration
		tooLarge bool
		bytes    int // the byte window's count after it
	}{
		{0, 600, true, 0, false, 600},
		{500 * ms, 500, false, 600 * ms, false, 600},
		{500 * ms, 400, true, 0, false, 1000},
		{500 * ms, 1, false, 600 * ms, false, 1000},
		{500 * ms, 0, true, 0, false, 1000},
		{700 * ms, 1001, false, 0, true, 0},
		{1100 * ms, 600, true, 0, false, 1000},
		{1600 * ms, 400, true, 0, false, 1000},
	} {
		v := tab.AllowAllAt("meter", "", ls, s.size, t0.Add(s.at))
		if v.Allowed != s.allowed || v.RetryAfter != s.retry || v.TooLarge != s.tooLarge || !s.tooLarge && v.Windows[1].Count != s.bytes {
			t.Fatalf("at +%v size %d: %+v; want allowed %v retry %v too large %v bytes %d", s.at, s.size, v, s.allowed, s.retry, s.tooLarge, s.bytes)
		}
	}
}

// TestClassesAndWindowsApart: a topic class has windows of its own, and
// the device's first message window is its single-window key, so a
// window kept by AllowAt is the same one.
func TestClassesAndWindowsApart(t *testing.T) {
	tab := newTable(t, 10)
	one := []Limit{{Messages, 2, time.Second}}
	for range 2 {
		tab.AllowAt("meter", Quota{Limit: 2, Window: time.Second}, t0)
	}
	if v := tab.AllowAllAt("meter", "", one, 0, t0); v.Allowed {
		t.Fatal("the device's own window did not see AllowAt's two messages")
	}
	for range 2 {
		if v := tab.AllowAllAt("meter", "alarms", one, 0, t0); !v.Allowed {
			t.Fatalf("the class alarms shares the device's budget: %+v", v)
		}
	}
	if v := tab.AllowAllAt("meter", "alarms", one, 0, t0); v.Allowed {
		t.Fatal("the class alarms took a third message")
	}
	if v := tab.AllowAllAt("other", "", one, 0, t0); !v.Allowed {
		t.Fatal("another device was refused")
	}
}

// TestAllowAllAtAllocatesNothing: the decision path, once a device has
// its windows, allocates nothing.
func TestAllowAllAtAllocatesNothing(t *testing.T) {
	tab := newTable(t, 20)
	ls := []Limit{{Messages, 1000, time.Second}, {Messages, 100000, time.Hour}, {Bytes, 1 << 30, time.Hour}}
	now := t0
	tab.AllowAllAt("meter", "telemetry", ls, 64, now)
	if allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(ms)
		tab.AllowAllAt("meter", "telemetry", ls, 64, now)
	}); allocs != 0 {
		t.Fatalf("AllowAllAt allocated %v times per call", allocs)
	}
}

// TestOtherWindowsRestored: a device's second window, handed out by
// Snapshot under its key and restored in another table (as a restart
// does), is found again by AllowAllAt: it lands in the device's shard.
func TestOtherWindowsRestored(t *testing.T) {
	ls := []Limit{{Messages, 100, time.Second}, {Messages, 3, time.Minute}}
	a, b := newTable(t, 10), newTable(t, 10)
	for range 3 {
		a.AllowAllAt("meter-7", "", ls, 0, t0)
	}
	s, _ := a.shard("meter-7")
	s.mu.Lock()
	key := string([]byte(s.windowKey("meter-7", "", Messages, 1)))
	s.mu.Unlock()
	for _, k := range []string{"meter-7", key} {
		w, ok := a.Snapshot(k)
		if !ok {
			t.Fatalf("no window under %q", k)
		}
		if err := b.Restore(k, w); err != nil {
			t.Fatal(err)
		}
	}
	if v := b.AllowAllAt("meter-7", "", ls, 0, t0.Add(time.Second)); v.Allowed || v.Refused != 1 {
		t.Fatalf("after the restore: %+v, want refused by the minute window", v)
	}
	if err := b.Restore("meter-7\x00"+strings.Repeat("x", 301), Window{}); err == nil {
		t.Fatal("a key with a 301-byte suffix was restored")
	}
}

// TestResetEmptiesEveryWindow: Reset of a device empties its other
// windows and its classes' too, not another device's.
func TestResetEmptiesEveryWindow(t *testing.T) {
	tab := newTable(t, 10)
	ls := []Limit{{Messages, 1, time.Minute}, {Bytes, 10, time.Minute}}
	for _, d := range []string{"meter", "meter-2"} {
		tab.AllowAllAt(d, "", ls, 10, t0)
		tab.AllowAllAt(d, "alarms", ls, 10, t0)
	}
	if tab.Len() != 8 {
		t.Fatalf("%d windows, want 8", tab.Len())
	}
	if !tab.Reset("meter") || tab.Len() != 4 {
		t.Fatalf("after Reset: %d windows, want the other device's 4", tab.Len())
	}
	for _, class := range []string{"", "alarms"} {
		if v := tab.AllowAllAt("meter", class, ls, 10, t0); !v.Allowed {
			t.Fatalf("class %q after Reset: %+v", class, v)
		}
		if v := tab.AllowAllAt("meter-2", class, ls, 10, t0); v.Allowed {
			t.Fatalf("the other device's class %q was reset", class)
		}
	}
	if tab.Reset("nobody") {
		t.Fatal("Reset of a device without windows reported some")
	}
}
