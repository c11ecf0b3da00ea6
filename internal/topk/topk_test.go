package topk

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// topT0 is the start of a Tracker period of 10 s.
const topT0 = devicelimit.Tick(1_700_000_000 * int64(time.Second))

func TestTopKExactBelowK(t *testing.T) {
	tk := New(8, 10*time.Second)
	want := map[string]uint64{"a": 5, "b": 3, "c": 3, "d": 1}
	now := topT0
	for dev, n := range want {
		for range n {
			tk.Record(dev, now)
			now = now.Add(time.Millisecond)
		}
	}
	got := tk.Top(0, now)
	wantTop := []Entry{{"a", 5}, {"b", 3}, {"c", 3}, {"d", 1}}
	if !slices.Equal(got, wantTop) {
		t.Fatalf("got %v, want %v", got, wantTop)
	}
	if got := tk.Top(2, now); !slices.Equal(got, wantTop[:2]) {
		t.Fatalf("Top(2): got %v, want %v", got, wantTop[:2])
	}
	if got := tk.Top(100, now); !slices.Equal(got, wantTop) {
		t.Fatalf("Top(100): got %v, want %v", got, wantTop)
	}
}

// TestTopKHeavyHitters checks the Space-Saving guarantee on random
// streams: every device refused more than N/k times is in the summary,
// its count is never under its true count, and the summary holds at most
// k devices.
func TestTopKHeavyHitters(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for seq := range 200 {
		k := 1 + r.IntN(20)
		tk := New(k, time.Hour)
		heavy := 1 + r.IntN(k)
		var stream []string
		for i := range heavy {
			for range 50 + r.IntN(200) {
				stream = append(stream, fmt.Sprintf("heavy-%d", i))
			}
		}
		for range 1000 + r.IntN(3000) {
			stream = append(stream, fmt.Sprintf("light-%d", r.IntN(5000)))
		}
		r.Shuffle(len(stream), func(i, j int) { stream[i], stream[j] = stream[j], stream[i] })

		truth := map[string]uint64{}
		for _, dev := range stream {
			truth[dev]++
			tk.Record(dev, topT0)
		}
		top := tk.Top(0, topT0)
		if len(top) > k {
			t.Fatalf("seq %d: %d entries, want <= k=%d", seq, len(top), k)
		}
		var sum uint64
		got := map[string]uint64{}
		for _, e := range top {
			got[e.Device] = e.Refused
			sum += e.Refused
		}
		if sum != uint64(len(stream)) {
			t.Fatalf("seq %d: counts sum to %d, want N=%d", seq, sum, len(stream))
		}
		for dev, n := range truth {
			c, ok := got[dev]
			if n*uint64(k) > uint64(len(stream)) && !ok {
				t.Fatalf("seq %d: %s refused %d > N/k=%d/%d times, not in the summary %v", seq, dev, n, len(stream), k, top)
			}
			if ok && c < n {
				t.Fatalf("seq %d: %s counted %d, under its true %d", seq, dev, c, n)
			}
		}
	}
}

func TestTopKBoundedMemory(t *testing.T) {
	tk := New(16, 10*time.Second)
	for i := range 100_000 {
		tk.Record(fmt.Sprintf("dev-%d", i), topT0)
	}
	if n := tk.Len(topT0); n != 16 {
		t.Fatalf("got %d entries, want 16", n)
	}
	if c := cap(tk.entries); c != 16 {
		t.Fatalf("entries capacity %d, want 16", c)
	}
	if n := len(tk.index); n != 16 {
		t.Fatalf("index has %d devices, want 16", n)
	}
}

// TestTopKDecay steps through periods of 10 s at fixed instants: counts
// of the current and previous period are summed, older ones forgotten.
func TestTopKDecay(t *testing.T) {
	const p = 10 * time.Second
	tk := New(4, p)
	at := func(d time.Duration) devicelimit.Tick { return topT0.Add(d) }
	record := func(dev string, n int, now devicelimit.Tick) {
		for range n {
			tk.Record(dev, now)
		}
	}
	steps := []struct {
		name string
		do   func()
		now  devicelimit.Tick
		want []Entry
	}{
		{"t0: a×3, b×1", func() { record("a", 3, at(0)); record("b", 1, at(0)) }, at(0),
			[]Entry{{"a", 3}, {"b", 1}}},
		{"t0+9.999s: same period", func() {}, at(p - time.Millisecond),
			[]Entry{{"a", 3}, {"b", 1}}},
		{"t0+10s: previous still counts; b×4", func() { record("b", 4, at(p)) }, at(p),
			[]Entry{{"b", 5}, {"a", 3}}},
		{"t0+20s: t0's period forgotten", func() {}, at(2 * p),
			[]Entry{{"b", 4}}},
		{"t0+25s: c×2", func() { record("c", 2, at(2*p+5*time.Second)) }, at(2*p + 5*time.Second),
			[]Entry{{"b", 4}, {"c", 2}}},
		{"t0+30s: b's period forgotten", func() {}, at(3 * p),
			[]Entry{{"c", 2}}},
		{"t0+60s: a gap of several periods forgets all", func() {}, at(6 * p),
			[]Entry{}},
		{"t0+60s: a×1 after the gap", func() { record("a", 1, at(6*p)) }, at(6 * p),
			[]Entry{{"a", 1}}},
	}
	for _, s := range steps {
		s.do()
		if got := tk.Top(0, s.now); !slices.Equal(got, s.want) {
			t.Fatalf("%s: got %v, want %v", s.name, got, s.want)
		}
	}
	if n := tk.Len(at(6 * p)); n != 1 {
		t.Fatalf("Len: got %d, want 1", n)
	}
}

// TestTopKReplaceTakesMinimum checks the replacement rule: a new device
// takes the least-refused entry and its count plus one.
func TestTopKReplaceTakesMinimum(t *testing.T) {
	tk := New(2, time.Hour)
	for range 3 {
		tk.Record("a", topT0)
	}
	tk.Record("b", topT0)
	tk.Record("c", topT0) // replaces b (1), inherits its count
	want := []Entry{{"a", 3}, {"c", 2}}
	if got := tk.Top(0, topT0); !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestTopKRecordTrackedAllocatesNothing(t *testing.T) {
	tk := New(4, 10*time.Second)
	devs := []string{"a", "b", "c", "d"}
	for _, d := range devs {
		tk.Record(d, topT0)
	}
	now := topT0
	i := 0
	if n := testing.AllocsPerRun(1000, func() {
		tk.Record(devs[i%len(devs)], now)
		i++
		now = now.Add(time.Millisecond) // crosses periods: rotation allocates nothing either
	}); n != 0 {
		t.Fatalf("got %v allocs per Record, want 0", n)
	}
}

func TestTopKConcurrent(t *testing.T) {
	tk := New(8, 10*time.Second)
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 1000 {
				tk.Record(fmt.Sprintf("d%d", (g+i)%6), topT0)
			}
		}()
	}
	for range 4 {
		<-done
	}
	var sum uint64
	for _, e := range tk.Top(0, topT0) {
		sum += e.Refused
	}
	if sum != 4000 {
		t.Fatalf("got %d refusals, want 4000", sum)
	}
}

func TestNewTopKPanics(t *testing.T) {
	for _, c := range []struct {
		k int
		p time.Duration
	}{{0, time.Second}, {1, 0}, {-1, time.Second}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Fatalf("New(%d, %v) did not panic", c.k, c.p)
				}
			}()
			New(c.k, c.p)
		}()
	}
}

// TestTopKRotationKeepsSum checks, on random streams over several
// periods, that the counts sum to the refusals of the current and
// previous periods, and that the summary never holds more than k.
func TestTopKRotationKeepsSum(t *testing.T) {
	const p = 10 * time.Second
	r := rand.New(rand.NewPCG(3, 4))
	for seq := range 100 {
		k := 1 + r.IntN(10)
		tk := New(k, p)
		perPeriod := map[int64]uint64{}
		now := topT0
		for range 2000 {
			now = now.Add(time.Duration(r.IntN(int(200 * time.Millisecond))))
			tk.Record(fmt.Sprintf("d%d", r.IntN(3*k)), now)
			gen := int64(now) / int64(p)
			perPeriod[gen]++
			var sum uint64
			top := tk.Top(0, now)
			for _, e := range top {
				sum += e.Refused
			}
			if want := perPeriod[gen] + perPeriod[gen-1]; sum != want {
				t.Fatalf("seq %d at %v: counts sum to %d, want %d", seq, now, sum, want)
			}
			if len(top) > k || tk.K() != k {
				t.Fatalf("seq %d: %d entries, K %d, want <= k=%d", seq, len(top), tk.K(), k)
			}
		}
	}
}
