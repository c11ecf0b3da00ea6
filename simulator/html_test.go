package simulator

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestWriteHTMLSelfContained renders a report of synthetic logs and
// checks the page fetches nothing and carries the three charts with
// their data: a bar per outcome present in the timeline, a device over
// its limit in the last histogram bucket, the latency bars.
func TestWriteHTMLSelfContained(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	q := devicelimit.Quota{Limit: 3, Window: time.Second, Policy: devicelimit.PolicyDrop}
	var logs []DeviceLog
	for d, dev := range []string{"a", "b", "c"} {
		l := DeviceLog{Device: dev, Quota: q}
		for i := range 10 {
			at := t0.Add(time.Duration(i) * 300 * time.Millisecond)
			ack := AckSuccess
			if i%3 == 2 && d != 2 {
				ack = AckRefused
			}
			l.Sent = append(l.Sent, Sent{Seq: uint64(i), At: at, Ack: ack})
			if ack == AckSuccess {
				l.Arrivals = append(l.Arrivals, Arrival{Seq: uint64(i), At: at.Add(time.Duration(i+1) * time.Millisecond)})
			}
		}
		logs = append(logs, l)
	}
	res := Check(logs, CheckOptions{Tolerance: 10 * time.Millisecond})
	rep := &Report{Config: Config{Devices: 3, Quota: q}, Started: t0, Finished: t0.Add(4 * time.Second), Result: res, Verdict: Decide(res, 10)}
	var b strings.Builder
	if err := rep.WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	if m := regexp.MustCompile(`(?i)https?://|<script|<link|<img|\bsrc=|@import|url\(`).FindString(page); m != "" {
		t.Fatalf("page refers outside itself: %q", m)
	}
	for _, id := range []string{`id="throughput"`, `id="histogram"`, `id="latency"`} {
		if strings.Count(page, id) != 1 {
			t.Fatalf("page lacks the chart %s", id)
		}
	}
	if o, c := strings.Count(page, "<svg"), strings.Count(page, "</svg>"); o != 3 || c != 3 {
		t.Fatalf("%d <svg> and %d </svg>, want 3 each", o, c)
	}
	if !strings.Contains(page, `class="bar accepted"`) || !strings.Contains(page, `class="bar refused"`) {
		t.Fatal("throughput chart lacks accepted or refused bars")
	}
	// Device c was admitted every message: 4 in a window of 1 s against
	// 3, so it sits in the "over 100%" bucket; a and b at their limit.
	if !strings.Contains(page, "<title>over 100%: 1 devices</title>") || !strings.Contains(page, "<title>≤100%: 2 devices</title>") {
		t.Fatalf("histogram lacks the device over its limit:\n%s", page)
	}
	if !strings.Contains(page, "FAIL") || !strings.Contains(page, "<title>p99 ") {
		t.Fatal("page lacks the verdict or the latency chart")
	}
}

// TestTimelineSumsToTotals checks every sent message lands in one bin of
// the series of its outcome.
func TestTimelineSumsToTotals(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	q := devicelimit.Quota{Limit: 2, Window: time.Second, Policy: devicelimit.PolicyDefer}
	l := DeviceLog{Device: "a", Quota: q}
	for i := range 40 {
		at := t0.Add(time.Duration(i) * 500 * time.Millisecond)
		s := Sent{Seq: uint64(i), At: at, Ack: Ack(i % 3)}
		l.Sent = append(l.Sent, s)
		if i%5 == 1 {
			l.Arrivals = append(l.Arrivals, Arrival{Seq: uint64(i), At: at.Add(time.Duration(i%2) * time.Second)})
		}
	}
	res := Check([]DeviceLog{l}, CheckOptions{Immediate: 250 * time.Millisecond})
	tl, tot := res.Timeline, res.Totals
	sum := func(s []int) (n int) {
		for _, v := range s {
			n += v
		}
		return n
	}
	if tl.BinNS != 250*time.Millisecond || len(tl.Accepted) != 79 || !tl.Start.Equal(t0) {
		t.Fatalf("timeline over 19.5 s: start %v, bin %v, %d bins", tl.Start, tl.BinNS, len(tl.Accepted))
	}
	if sum(tl.Accepted) != tot.Accepted || sum(tl.Refused) != tot.Refused || sum(tl.Deferred) != tot.Deferred ||
		sum(tl.Lost) != tot.Lost || sum(tl.Unacked) != tot.Unacked {
		t.Fatalf("timeline %+v does not match totals %+v", tl, tot.Counts)
	}
	if Check(nil, CheckOptions{}).Timeline != nil {
		t.Fatal("no messages: want no timeline")
	}
}

// TestTimelineLatency checks each bin's latency figures come from the
// messages sent in that bin that arrived, refusals and the unarrived
// left out.
func TestTimelineLatency(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	q := devicelimit.Quota{Limit: 1000, Window: time.Second}
	l := DeviceLog{Device: "a", Quota: q}
	// 100 messages at t0 (latencies 1..100 ms) and one at t0+30 s (a
	// refusal that arrived anyway: leaked, no latency), one at t0+60 s
	// never arrived: 120 bins of 500 ms, only the first with latencies.
	for i := range 100 {
		l.Sent = append(l.Sent, Sent{Seq: uint64(i), At: t0, Ack: AckSuccess})
		l.Arrivals = append(l.Arrivals, Arrival{Seq: uint64(i), At: t0.Add(time.Duration(i+1) * time.Millisecond)})
	}
	l.Sent = append(l.Sent, Sent{Seq: 100, At: t0.Add(30 * time.Second), Ack: AckRefused},
		Sent{Seq: 101, At: t0.Add(60 * time.Second), Ack: AckSuccess})
	l.Arrivals = append(l.Arrivals, Arrival{Seq: 100, At: t0.Add(31 * time.Second)})
	tl := Check([]DeviceLog{l}, CheckOptions{}).Timeline
	if len(tl.LatencyP99) != len(tl.Accepted) || len(tl.LatencyMax) != len(tl.Accepted) {
		t.Fatalf("latency series of %d and %d bins, want %d", len(tl.LatencyP99), len(tl.LatencyMax), len(tl.Accepted))
	}
	if tl.LatencyP99[0] != 99*time.Millisecond || tl.LatencyMax[0] != 100*time.Millisecond {
		t.Fatalf("first bin: p99 %v max %v, want 99ms and 100ms", tl.LatencyP99[0], tl.LatencyMax[0])
	}
	for i := 1; i < len(tl.LatencyP99); i++ {
		if tl.LatencyP99[i] != 0 || tl.LatencyMax[i] != 0 {
			t.Fatalf("bin %d: p99 %v max %v, want none", i, tl.LatencyP99[i], tl.LatencyMax[i])
		}
	}
}
