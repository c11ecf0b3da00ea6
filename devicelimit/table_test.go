package devicelimit

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// t0 is a fixed instant aligned to every bucket width used below.
const t0 = Tick(1_700_000_000_000_000_000)

func newTable(t testing.TB, buckets int) *Table {
	t.Helper()
	tab, err := NewTable(buckets)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

type step struct {
	at        time.Duration // offset from t0
	allowed   bool
	count     int
	remaining int
	retry     time.Duration
}

func runSteps(t *testing.T, tab *Table, q Quota, steps []step) {
	t.Helper()
	for i, s := range steps {
		got := tab.AllowAt("dev", q, t0.Add(s.at))
		want := Decision{Allowed: s.allowed, Count: s.count, Limit: q.Limit, Remaining: s.remaining, RetryAfter: s.retry}
		if got != want {
			t.Fatalf("step %d at t0+%v: got %+v, want %+v", i, s.at, got, want)
		}
	}
}

const ms = time.Millisecond

// 3 per 100 ms, 4 buckets of 25 ms, 5 slots.
var q3 = Quota{Limit: 3, Window: 100 * ms}

func TestStepsFillAndRetryAfter(t *testing.T) {
	runSteps(t, newTable(t, 4), q3, []step{
		{0, true, 1, 2, 0},
		{10 * ms, true, 2, 1, 0},
		{20 * ms, true, 3, 0, 0},
		{30 * ms, false, 3, 0, 95 * ms},   // bucket 0 leaves the window at 125 ms
		{124 * ms, false, 3, 0, 1 * ms},   // RetryAfter-1ms earlier: still refused
		{125 * ms, true, 1, 2, 0},         // exactly at now+RetryAfter: admitted
		{125 * ms, true, 2, 1, 0},         // same instant again
		{149 * ms, true, 3, 0, 0},         // bucket 5 still in the window
		{150 * ms, false, 3, 0, 100 * ms}, // bucket 5 holds all 3: leaves at 250 ms
	})
}

func TestStepsExactWindowBoundary(t *testing.T) {
	// Admissions at t0 and t0+T lie in one closed interval of length T:
	// the second must be refused, one nanosecond of a bucket later not.
	q := Quota{Limit: 1, Window: 100 * ms}
	runSteps(t, newTable(t, 4), q, []step{
		{0, true, 1, 0, 0},
		{100 * ms, false, 1, 0, 25 * ms},
		{125*ms - 1, false, 1, 0, 1},
		{125 * ms, true, 1, 0, 0},
	})
}

func TestStepsRolloverOfEverySlot(t *testing.T) {
	// One message at the start of each bucket for three laps of the ring:
	// the count is the messages in the last 5 buckets, whichever slot.
	q := Quota{Limit: 100, Window: 100 * ms}
	var steps []step
	for k := 0; k < 15; k++ {
		n := min(k+1, 5)
		steps = append(steps, step{time.Duration(k) * 25 * ms, true, n, 100 - n, 0})
	}
	runSteps(t, newTable(t, 4), q, steps)
}

func TestStepsPartialRollover(t *testing.T) {
	// Counts in buckets 0,1,2; a jump to bucket 6 expires 0 and 1 only.
	q := Quota{Limit: 10, Window: 100 * ms}
	runSteps(t, newTable(t, 4), q, []step{
		{0, true, 1, 9, 0},
		{25 * ms, true, 2, 8, 0},
		{25 * ms, true, 3, 7, 0},
		{50 * ms, true, 4, 6, 0},
		{150 * ms, true, 2, 8, 0}, // window is buckets 2..6
		{175 * ms, true, 2, 8, 0}, // buckets 3..7: bucket 2 gone
	})
}

func TestStepsIdleGaps(t *testing.T) {
	q := Quota{Limit: 2, Window: 100 * ms}
	runSteps(t, newTable(t, 4), q, []step{
		{0, true, 1, 1, 0},
		{1 * ms, true, 2, 0, 0},
		{124 * ms, false, 2, 0, 1 * ms},                  // one lap minus a bucket: still counted
		{125 * ms, true, 1, 1, 0},                        // exactly one lap of 5 slots later
		{125*ms + 100*time.Hour, true, 1, 1, 0},          // many laps idle
		{125*ms + 100*time.Hour + 1, true, 2, 0, 0},      //
		{125*ms + 100*time.Hour + 200*ms, true, 1, 1, 0}, // longer than T
	})
}

func TestStepsClockBehindHead(t *testing.T) {
	// A tick older than the newest bucket is decided as of that bucket:
	// it can neither revive expired buckets nor count in the past.
	q := Quota{Limit: 2, Window: 100 * ms}
	runSteps(t, newTable(t, 4), q, []step{
		{200 * ms, true, 1, 1, 0},
		{0, true, 2, 0, 0},
		{0, false, 2, 0, 325 * ms}, // the window admits at 325 ms: 325 ms after the caller's tick
	})
}

// A re-cut to a shorter window can put the counts in a bucket after now
// (the old bucket they were in ends later); RetryAfter still counts from
// now. It used to count from that bucket's start and came out 215 ms
// short.
func TestRecutRetryAfterFromNow(t *testing.T) {
	tab := newTable(t, 4)
	long := Quota{Limit: 2, Window: time.Second} // buckets of 250 ms
	for range 2 {
		tab.AllowAt("dev", long, t0)
	}
	short := Quota{Limit: 2, Window: 100 * ms} // buckets of 25 ms
	// The counts move to the bucket holding the old one's end,
	// [225 ms, 250 ms), which leaves the window at 350 ms.
	d := tab.AllowAt("dev", short, t0.Add(10*ms))
	if d.Allowed || d.RetryAfter != 340*ms {
		t.Fatalf("after the re-cut: %+v, want refused with RetryAfter 340ms", d)
	}
	if d := tab.AllowAt("dev", short, t0.Add(350*ms-1)); d.Allowed {
		t.Fatalf("admitted before RetryAfter: %+v", d)
	}
	if d := tab.AllowAt("dev", short, t0.Add(350*ms)); !d.Allowed {
		t.Fatalf("refused at RetryAfter: %+v", d)
	}
}

func TestQuotaChangeKeepsCounts(t *testing.T) {
	tab := newTable(t, 4)
	for i := 0; i < 5; i++ {
		tab.AllowAt("dev", Quota{Limit: 10, Window: 100 * ms}, t0)
	}
	// Lower limit: refused at once, the five counts stay.
	if d := tab.AllowAt("dev", Quota{Limit: 3, Window: 100 * ms}, t0.Add(ms)); d.Allowed || d.Count != 5 {
		t.Fatalf("after lowering the limit got %+v, want refused with count 5", d)
	}
	// Longer window: the counts stay and now expire with the new length.
	q := Quota{Limit: 5, Window: time.Second}
	if d := tab.AllowAt("dev", q, t0.Add(2*ms)); d.Allowed || d.Count != 5 {
		t.Fatalf("after lengthening the window got %+v, want refused with count 5", d)
	}
	if d := tab.AllowAt("dev", q, t0.Add(500*ms)); d.Allowed {
		t.Fatalf("counts expired early after recut: %+v", d)
	}
	if d := tab.AllowAt("dev", q, t0.Add(2*time.Second)); !d.Allowed || d.Count != 1 {
		t.Fatalf("counts never expired after recut: %+v", d)
	}
	// A limit above 255 widens the counters; the counts survive.
	tab.AllowAt("dev", q, t0.Add(2*time.Second))
	if d := tab.AllowAt("dev", Quota{Limit: 100000, Window: time.Second}, t0.Add(2*time.Second)); !d.Allowed || d.Count != 3 {
		t.Fatalf("after widening got %+v, want allowed with count 3", d)
	}
}

func TestWideCounters(t *testing.T) {
	for _, limit := range []int{255, 256, 65535, 65536, 300000} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			tab := newTable(t, 2)
			q := Quota{Limit: limit, Window: time.Second}
			for i := 1; i <= limit; i++ {
				if d := tab.AllowAt("dev", q, t0); !d.Allowed || d.Count != i {
					t.Fatalf("message %d: got %+v", i, d)
				}
			}
			if d := tab.AllowAt("dev", q, t0); d.Allowed || d.Count != limit {
				t.Fatalf("over limit: got %+v", d)
			}
		})
	}
}

func TestInvalidQuotaRefused(t *testing.T) {
	tab := newTable(t, 20)
	for _, q := range []Quota{{}, {Limit: 1}, {Limit: 0, Window: time.Second}, {Limit: 1, Window: 10 * ms}} {
		if d := tab.AllowAt("dev", q, t0); d.Allowed {
			t.Fatalf("quota %+v admitted: %+v", q, d)
		}
	}
	if tab.Len() != 0 {
		t.Fatalf("invalid quotas created %d windows", tab.Len())
	}
}

func TestPeekDoesNotCount(t *testing.T) {
	tab := newTable(t, 4)
	if d := tab.PeekAt("dev", q3, t0); d.Allowed || d.Remaining != 3 || tab.Len() != 0 {
		t.Fatalf("peek on a new device: %+v, %d windows", d, tab.Len())
	}
	tab.AllowAt("dev", q3, t0)
	if d := tab.PeekAt("dev", q3, t0); d.Count != 1 || d.Remaining != 2 {
		t.Fatalf("peek: got %+v, want count 1 remaining 2", d)
	}
	if d := tab.AllowAt("dev", q3, t0); d.Count != 2 {
		t.Fatalf("peek counted: %+v", d)
	}
}

func TestResetAndSweep(t *testing.T) {
	tab := newTable(t, 4)
	const n = 10000
	for i := 0; i < n; i++ {
		tab.AllowAt(fmt.Sprint("dev-", i), q3, t0)
	}
	tab.AllowAt("late", q3, t0.Add(100*ms))
	if got := tab.Len(); got != n+1 {
		t.Fatalf("Len = %d, want %d", got, n+1)
	}
	if !tab.Reset("dev-0") || tab.Reset("dev-0") {
		t.Fatal("Reset should report the window once")
	}
	if got := tab.Sweep(t0.Add(124 * ms)); got != 0 {
		t.Fatalf("swept %d windows still holding counts", got)
	}
	if got := tab.Sweep(t0.Add(125 * ms)); got != n-1 {
		t.Fatalf("swept %d, want %d", got, n-1)
	}
	if got := tab.Len(); got != 1 {
		t.Fatalf("Len after sweep = %d, want 1", got)
	}
	if d := tab.AllowAt("late", q3, t0.Add(125*ms)); d.Count != 2 {
		t.Fatalf("surviving window lost its count: %+v", d)
	}
}

func TestAllowAtAllocatesNothing(t *testing.T) {
	tab := newTable(t, 20)
	q := Quota{Limit: 1000, Window: time.Second}
	tab.AllowAt("dev", q, t0)
	now := t0
	allocs := testing.AllocsPerRun(1000, func() {
		now += Tick(ms)
		tab.AllowAt("dev", q, now)
	})
	if allocs != 0 {
		t.Fatalf("AllowAt allocated %v times per call", allocs)
	}
}

func TestConcurrentSameDevice(t *testing.T) {
	tab := newTable(t, 20)
	q := Quota{Limit: 500, Window: time.Second}
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for i := 0; i < 200; i++ {
				if tab.AllowAt("shared", q, t0).Allowed {
					n++
				}
			}
			mu.Lock()
			admitted += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	if admitted != q.Limit {
		t.Fatalf("admitted %d of 1600 concurrent messages, want exactly %d", admitted, q.Limit)
	}
}

func TestNewTableValidates(t *testing.T) {
	for _, b := range []int{-1, MaxBuckets + 1} {
		if _, err := NewTable(b); err == nil {
			t.Fatalf("NewTable(%d) accepted", b)
		}
	}
	tab, err := NewTable(0)
	if err != nil || tab.Buckets() != DefaultBuckets {
		t.Fatalf("NewTable(0) = %v, %v; want default buckets", tab, err)
	}
}

func TestGrowKeepsDecisions(t *testing.T) {
	tab := newTable(t, 4)
	tab.AllowAt("before", q3, t0)
	tab.Grow(100000)
	for i := 0; i < 1000; i++ {
		tab.AllowAt(fmt.Sprint("dev-", i), q3, t0)
	}
	if d := tab.AllowAt("before", q3, t0); d.Count != 2 {
		t.Fatalf("Grow lost a window: %+v", d)
	}
	if got := tab.Len(); got != 1001 {
		t.Fatalf("Len = %d, want 1001", got)
	}
}

// TestGrowAfterEviction grows a table whose shard is empty but has held a
// window (evicted by Reset, its record on the free list): windows
// allocated afterwards must keep records of their own, so one device's
// window is never emptied through another's.
func TestGrowAfterEviction(t *testing.T) {
	tab := newTable(t, 10)
	q := Quota{Limit: 1, Window: time.Second}
	short := Quota{Limit: 1, Window: 100 * ms}
	// Three devices in one shard.
	devs := []string{"d0"}
	s0, _ := tab.shard(devs[0])
	for i := 1; len(devs) < 3; i++ {
		if d := fmt.Sprintf("d%d", i); shardOf(tab, d) == s0 {
			devs = append(devs, d)
		}
	}
	if !tab.AllowAt(devs[0], q, t0).Allowed {
		t.Fatal("first message refused")
	}
	tab.Reset(devs[0]) // the shard is empty again, its record free
	tab.Grow(100_000)
	if d := tab.AllowAt(devs[1], q, t0); !d.Allowed {
		t.Fatalf("%s: first message refused: %+v", devs[1], d)
	}
	if d := tab.AllowAt(devs[2], short, t0); !d.Allowed {
		t.Fatalf("%s: first message refused: %+v", devs[2], d)
	}
	// devs[2]'s window has expired, devs[1]'s has not.
	tab.Sweep(t0.Add(500 * ms))
	if d := tab.AllowAt(devs[1], q, t0.Add(500*ms)); d.Allowed {
		t.Fatalf("%s: second message within %v admitted with limit 1: %+v", devs[1], q.Window, d)
	}
}

func shardOf(tab *Table, device string) *shard {
	s, _ := tab.shard(device)
	return s
}

// A device whose quota alternates between two window lengths (an
// override set and lifted, or gateways that disagree) keeps being
// served: each re-cut moves a count to the bucket holding its old
// bucket's end, not to the newest bucket, where counts moved at every
// change never expired and the device got 5 messages in 20 s. No second
// ever holds more than 5.
func TestRecutAlternatingWindowsKeepsServing(t *testing.T) {
	tab := newTable(t, 4)
	quotas := []Quota{{Limit: 5, Window: time.Second}, {Limit: 5, Window: 2 * time.Second}}
	var admitted []Tick
	for i := range 200 { // 10 a second for 20 s
		now := t0.Add(time.Duration(i) * 100 * ms)
		if tab.AllowAt("dev", quotas[i%2], now).Allowed {
			admitted = append(admitted, now)
		}
	}
	if len(admitted) < 45 {
		t.Fatalf("%d admitted in 20 s, want at least 45 (5 per 2 s)", len(admitted))
	}
	for i := range admitted {
		n := 0
		for _, a := range admitted[i:] {
			if a.Sub(admitted[i]) < time.Second {
				n++
			}
		}
		if n > 5 {
			t.Fatalf("%d admitted within 1 s from %v", n, admitted[i])
		}
	}
	t.Logf("%d admitted in 20 s", len(admitted))
}
