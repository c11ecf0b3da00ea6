package simulator

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func ms(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }

// sent returns a success-acked message seq sent at ms(at).
func sent(seq uint64, at int, ack Ack) Sent { return Sent{Seq: seq, At: ms(at), Ack: ack} }

func arr(seq uint64, at int) Arrival { return Arrival{Seq: seq, At: ms(at)} }

func drop(limit int, window time.Duration) devicelimit.Quota {
	return devicelimit.Quota{Limit: limit, Window: window, Policy: devicelimit.PolicyDrop}
}

// partition checks that the buckets add up to Sent.
func partition(t *testing.T, d DeviceResult) {
	t.Helper()
	if got := d.Accepted + d.Refused + d.Deferred + d.Lost + d.Unacked; got != d.Sent {
		t.Fatalf("%s: accepted+refused+deferred+lost+unacked = %d, want sent %d (%+v)", d.Device, got, d.Sent, d)
	}
	if d.Deferred != d.Released+d.Pending {
		t.Fatalf("%s: deferred %d != released %d + pending %d", d.Device, d.Deferred, d.Released, d.Pending)
	}
	if d.Acked != d.Accepted+d.Refused+d.Deferred+d.Lost {
		t.Fatalf("%s: acked %d != accepted+refused+deferred+lost", d.Device, d.Acked)
	}
}

func TestCheckCountsEveryBucket(t *testing.T) {
	l := DeviceLog{
		Device: "dev-1",
		Quota:  drop(3, time.Second),
		Sent: []Sent{
			sent(1, 0, AckSuccess),   // accepted, latency 10ms
			sent(2, 100, AckSuccess), // accepted, delivered twice
			sent(3, 200, AckSuccess), // lost
			sent(4, 300, AckRefused), // refused
			sent(5, 400, AckRefused), // refused but arrived: leaked
			sent(6, 500, AckNone),    // unacked, arrived
			sent(7, 600, AckNone),    // unacked, missing
		},
		Arrivals: []Arrival{
			arr(1, 10), arr(2, 120), arr(2, 130), arr(5, 450), arr(6, 540),
			arr(99, 700), // phantom
		},
	}
	res := Check([]DeviceLog{l}, CheckOptions{})
	d := res.Devices[0]
	partition(t, d)
	want := DeviceResult{
		Device: "dev-1", Limit: 3, WindowNS: time.Second, Policy: "drop",
		Counts: Counts{Sent: 7, Acked: 5, Accepted: 2, Refused: 2, Lost: 1, Unacked: 2, UnackedArrived: 1,
			Leaked: 1, Duplicated: 1, Phantom: 1},
		// latencies 10, 20, 40 ms (seq 1, 2, 6); seq 5 was refused.
		Latency: Latency{LatencyP50: 20 * time.Millisecond, LatencyP95: 40 * time.Millisecond,
			LatencyP99: 40 * time.Millisecond, LatencyMax: 40 * time.Millisecond},
		// first arrivals 10, 120, 450, 540, 700: all five within 1 s.
		MaxInWindow: 5, MaxWindowStart: ms(10), Excess: 2,
		// Of those, the leaked and the phantom are not admissions: the
		// timestamps confirm 3, the limit.
		Confirmed: 3, ConfirmedStart: ms(0),
	}
	if !reflect.DeepEqual(d, want) {
		t.Fatalf("got  %+v\nwant %+v", d, want)
	}
	if d.UnackedMissing() != 1 || d.Unexpected() != 3 || !d.Failed() {
		t.Fatalf("unacked missing %d unexpected %d failed %v", d.UnackedMissing(), d.Unexpected(), d.Failed())
	}
}

func TestCheckDeferBuckets(t *testing.T) {
	l := DeviceLog{
		Device: "d",
		Quota:  devicelimit.Quota{Limit: 2, Window: time.Second, Policy: devicelimit.PolicyDefer},
		Sent: []Sent{
			sent(1, 0, AckSuccess),  // arrives at 5: accepted
			sent(2, 10, AckSuccess), // arrives at 20: accepted
			sent(3, 20, AckSuccess), // arrives at 1100: released
			sent(4, 30, AckSuccess), // never: pending
		},
		Arrivals: []Arrival{arr(1, 5), arr(2, 20), arr(3, 1100)},
	}
	d := Check([]DeviceLog{l}, CheckOptions{Immediate: 100 * time.Millisecond}).Devices[0]
	partition(t, d)
	if d.Accepted != 2 || d.Deferred != 2 || d.Released != 1 || d.Pending != 1 || d.Lost != 0 {
		t.Fatalf("got %+v", d)
	}
	if d.MaxInWindow != 2 || d.Excess != 0 || d.Failed() {
		t.Fatalf("window %d excess %d failed %v", d.MaxInWindow, d.Excess, d.Failed())
	}
}

func TestMaxInWindowSteps(t *testing.T) {
	w := time.Second
	for _, tc := range []struct {
		name  string
		at    []int
		w     time.Duration
		want  int
		start int
	}{
		{"empty", nil, w, 0, -1},
		{"one", []int{5}, w, 1, 5},
		{"exactly T apart are separate windows", []int{0, 1000, 2000}, w, 1, 0},
		{"just under T", []int{0, 999}, w, 2, 0},
		{"same instant", []int{7, 7, 7}, w, 3, 7},
		{"later window is fuller", []int{0, 1500, 1600, 1700, 2400}, w, 4, 1500},
		{"tolerance shrinks the window", []int{0, 950}, w - 100*time.Millisecond, 1, 0},
		{"zero window", []int{0, 0}, 0, 1, 0},
	} {
		pts := make([]point, len(tc.at))
		for i, a := range tc.at {
			pts[i] = point{at: ms(a), size: 100}
		}
		n, s := maxInWindow(pts, devicelimit.Limit{N: 1, Window: w}, tc.w)
		wantStart := time.Time{}
		if tc.start >= 0 {
			wantStart = ms(tc.start)
		}
		if n != tc.want || !s.Equal(wantStart) {
			t.Errorf("%s: got %d at %v, want %d at %v", tc.name, n, s, tc.want, wantStart)
		}
	}
}

func TestCheckToleranceAbsorbsJitter(t *testing.T) {
	// The gateway admitted 1 per second at 0 and 1000 ms; jitter
	// delivered the first 30 ms late.
	l := DeviceLog{
		Device:   "d",
		Quota:    drop(1, time.Second),
		Sent:     []Sent{sent(1, 0, AckSuccess), sent(2, 1000, AckSuccess)},
		Arrivals: []Arrival{arr(1, 30), arr(2, 1001)},
	}
	if d := Check([]DeviceLog{l}, CheckOptions{}).Devices[0]; d.Excess != 1 {
		t.Fatalf("exact check: excess %d, want 1", d.Excess)
	}
	if d := Check([]DeviceLog{l}, CheckOptions{Tolerance: 50 * time.Millisecond}).Devices[0]; d.Excess != 0 {
		t.Fatalf("with tolerance: excess %d, want 0", d.Excess)
	}
}

func TestCheckTotalsAndDecide(t *testing.T) {
	ok := DeviceLog{Device: "a", Quota: drop(2, time.Second),
		Sent:     []Sent{sent(1, 0, AckSuccess), sent(2, 1, AckSuccess), sent(3, 2, AckRefused)},
		Arrivals: []Arrival{arr(1, 3), arr(2, 4)}}
	over := DeviceLog{Device: "c", Quota: drop(1, time.Second),
		Sent:     []Sent{sent(1, 0, AckSuccess), sent(2, 1, AckSuccess), sent(3, 2, AckSuccess)},
		Arrivals: []Arrival{arr(1, 3), arr(2, 4), arr(3, 5)}}
	lossy := DeviceLog{Device: "b", Quota: drop(5, time.Second),
		Sent:     []Sent{sent(1, 0, AckSuccess)},
		Arrivals: nil}
	res := Check([]DeviceLog{over, lossy, ok}, CheckOptions{})
	if got := []string{res.Devices[0].Device, res.Devices[1].Device, res.Devices[2].Device}; !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("order %v", got)
	}
	tt := res.Totals
	if tt.Devices != 3 || tt.Sent != 7 || tt.Accepted != 5 || tt.Refused != 1 || tt.Lost != 1 ||
		tt.Violations != 1 || tt.ExcessTotal != 2 || tt.MaxExcess != 2 {
		t.Fatalf("totals %+v", tt)
	}
	if tt.Accepted+tt.Refused+tt.Deferred+tt.Lost+tt.Unacked != tt.Sent {
		t.Fatalf("totals do not partition sent: %+v", tt)
	}
	v := Decide(res, 10)
	if v.OK || !slices.Equal(v.Worst, []string{"c", "b"}) {
		t.Fatalf("verdict %+v, want not ok, worst [c b]", v)
	}
	if v := Decide(res, 1); !slices.Equal(v.Worst, []string{"c"}) {
		t.Fatalf("verdict %+v, want worst [c]", v)
	}
	if v := Decide(Check([]DeviceLog{ok}, CheckOptions{}), 10); !v.OK || v.Worst != nil {
		t.Fatalf("verdict %+v, want ok", v)
	}
}

func TestPercentilesNearestRank(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i))
	}
	p50, p95, p99, pmax := percentiles(d)
	if p50 != 50 || p95 != 95 || p99 != 99 || pmax != 100 {
		t.Fatalf("got %v %v %v %v", p50, p95, p99, pmax)
	}
	if p50, _, _, _ := percentiles([]time.Duration{7}); p50 != 7 {
		t.Fatalf("one value: p50 %v", p50)
	}
}

// compliant returns arrival times in ms, sorted, such that no half-open
// window of w ms holds more than n: each new time is at least w after
// the n-th previous one.
func compliant(r *rand.Rand, n, w, count int) []int {
	var at []int
	cur := 0
	for len(at) < count {
		cur += r.IntN(w / 2) // often several in one window
		if k := len(at); k >= n && cur < at[k-n]+w {
			cur = at[k-n] + w
		}
		at = append(at, cur)
	}
	return at
}

func logOf(q devicelimit.Quota, at []int) DeviceLog {
	l := DeviceLog{Device: "p", Quota: q}
	for i, a := range at {
		l.Sent = append(l.Sent, sent(uint64(i), a, AckSuccess))
		l.Arrivals = append(l.Arrivals, arr(uint64(i), a))
	}
	return l
}

// bruteMax counts every window starting at an arrival, the definition.
func bruteMax(at []int, w int) int {
	best := 0
	for _, s := range at {
		n := 0
		for _, a := range at {
			if a >= s && a < s+w {
				n++
			}
		}
		best = max(best, n)
	}
	return best
}

func TestCheckPropertyCompliantLogsNeverViolate(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 500; iter++ {
		n := 1 + r.IntN(10)
		w := 100 + r.IntN(2000)
		at := compliant(r, n, w, 1+r.IntN(200))
		q := drop(n, time.Duration(w)*time.Millisecond)
		d := Check([]DeviceLog{logOf(q, at)}, CheckOptions{}).Devices[0]
		if d.Excess != 0 || d.MaxInWindow > n {
			t.Fatalf("iter %d: n=%d w=%d: excess %d max %d on compliant log %v", iter, n, w, d.Excess, d.MaxInWindow, at)
		}
		if b := bruteMax(at, w); b != d.MaxInWindow {
			t.Fatalf("iter %d: two-pointer %d, brute force %d", iter, d.MaxInWindow, b)
		}
		partition(t, d)

		// Find a full window (n arrivals within w) and insert one more
		// arrival inside it: now a violation, of exactly 1.
		full := -1
		for i := 0; i+n-1 < len(at); i++ {
			if at[i+n-1] < at[i]+w {
				full = i
				break
			}
		}
		if full < 0 {
			continue
		}
		lo, hi := at[full], at[full+n-1]
		extra := lo + r.IntN(hi-lo+1)
		at2 := append(slices.Clone(at), extra)
		slices.Sort(at2)
		d2 := Check([]DeviceLog{logOf(q, at2)}, CheckOptions{}).Devices[0]
		if d2.Excess != 1 || d2.MaxInWindow != n+1 || Decide(Result{Devices: []DeviceResult{d2}}, 1).OK {
			t.Fatalf("iter %d: n=%d w=%d extra at %d in [%d,%d]: excess %d max %d, want 1 and %d",
				iter, n, w, extra, lo, hi, d2.Excess, d2.MaxInWindow, n+1)
		}
	}
}

func TestAckText(t *testing.T) {
	for a := AckNone; a <= AckRefused; a++ {
		b, err := a.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var got Ack
		if err := got.UnmarshalText(b); err != nil || got != a {
			t.Fatalf("%s: got %v, %v", b, got, err)
		}
	}
	var a Ack
	if err := a.UnmarshalText([]byte("maybe")); err == nil {
		t.Fatal("unknown ack decoded")
	}
	if _, err := Ack(9).MarshalText(); err == nil {
		t.Fatal("unknown ack encoded")
	}
}

// BenchmarkCheck10kDevices checks a fleet of 10,000 devices that sent
// 100 messages each, half of them refused.
func BenchmarkCheck10kDevices(b *testing.B) {
	q := drop(5, time.Second)
	logs := make([]DeviceLog, 10000)
	for i := range logs {
		l := DeviceLog{Device: "dev-" + strconv.Itoa(i), Quota: q}
		for s := range 100 {
			ack := AckSuccess
			if s%2 == 1 {
				ack = AckRefused
			}
			l.Sent = append(l.Sent, sent(uint64(s), s*100, ack))
			if ack == AckSuccess {
				l.Arrivals = append(l.Arrivals, arr(uint64(s), s*100+1))
			}
		}
		logs[i] = l
	}
	b.ReportAllocs()
	for b.Loop() {
		if res := Check(logs, CheckOptions{Tolerance: 50 * time.Millisecond}); res.Totals.Violations != 0 {
			b.Fatalf("violations %d", res.Totals.Violations)
		}
	}
}

// TestCheckPlacesReleasesAtTheirStamp: a subscriber that fell behind
// receives two released messages together with the next second's two
// admissions, four within a window of 2. The gateway's release stamps
// (devicelimit.ReleasedProperty) place them where it admitted them, a
// second earlier: no excess. A stamp outside the message's send and
// arrival (another clock) is ignored, and the crowd counts again.
func TestCheckPlacesReleasesAtTheirStamp(t *testing.T) {
	released := func(seq uint64, at, rel int) Arrival { a := arr(seq, at); a.Released = ms(rel); return a }
	log := func(a3, a4 Arrival) DeviceLog {
		return DeviceLog{
			Device: "d",
			Quota:  devicelimit.Quota{Limit: 2, Window: time.Second, Policy: devicelimit.PolicyDefer},
			Sent: []Sent{sent(1, 0, AckSuccess), sent(2, 10, AckSuccess), sent(3, 20, AckSuccess), sent(4, 30, AckSuccess),
				sent(5, 2100, AckSuccess), sent(6, 2110, AckSuccess)},
			Arrivals: []Arrival{arr(1, 5), arr(2, 15), a3, a4, arr(5, 2105), arr(6, 2115)},
		}
	}
	opts := CheckOptions{Immediate: 100 * time.Millisecond, Tolerance: 50 * time.Millisecond}
	for _, tc := range []struct {
		name   string
		a3, a4 Arrival
		excess int
	}{
		{"no stamps", arr(3, 2000), arr(4, 2001), 2},
		{"stamped", released(3, 2000, 1000), released(4, 2001, 1010), 0},
		{"stamped after the arrival", released(3, 2000, 3000), released(4, 2001, 3010), 2},
		{"stamped before the send", released(3, 2000, 10), released(4, 2001, 10), 2},
	} {
		d := Check([]DeviceLog{log(tc.a3, tc.a4)}, opts).Devices[0]
		partition(t, d)
		if d.Released != 2 || d.Excess != tc.excess || d.Failed() != (tc.excess > 0) {
			t.Errorf("%s: released %d, excess %d (want %d), failed %v", tc.name, d.Released, d.Excess, tc.excess, d.Failed())
		}
	}
}
