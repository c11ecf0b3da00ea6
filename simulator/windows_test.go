package simulator

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestCheckSeveralWindowsAndClasses: every window of the device's own
// quota and of its topic class is judged on its own messages; a byte
// window counts payload bytes; the device is judged by the violated
// window.
func TestCheckSeveralWindowsAndClasses(t *testing.T) {
	own := devicelimit.WithWindows(devicelimit.PolicyDrop,
		devicelimit.Limit{N: 3, Window: time.Second}, devicelimit.Limit{Unit: devicelimit.Bytes, N: 250, Window: 10 * time.Second})
	alarms := devicelimit.Quota{Limit: 1, Window: time.Second}
	l := DeviceLog{Device: "dev-1", Quota: own, Classes: map[string]devicelimit.Quota{"alarms": alarms}}
	send := func(seq uint64, at int, size int, class string) {
		l.Sent = append(l.Sent, Sent{Seq: seq, At: ms(at), Ack: AckSuccess, AckAt: ms(at + 5), Size: size, Class: class})
		l.Arrivals = append(l.Arrivals, Arrival{Seq: seq, At: ms(at + 10)})
	}
	// Own: 3 messages in 1 s (at the limit), 100+100+60 = 260 bytes in
	// 10 s: 10 over the byte window. Alarms: 2 in a second, both
	// admitted, 1 over; they count in neither of the own windows.
	send(0, 0, 100, "")
	send(1, 100, 100, "")
	send(2, 200, 60, "")
	send(3, 300, 5000, "alarms")
	send(4, 400, 5000, "alarms")
	d, _ := checkDevice(l, CheckOptions{}, nil)
	if len(d.Windows) != 3 {
		t.Fatalf("windows %+v: want the own message and byte windows and the class's", d.Windows)
	}
	want := []struct {
		class, unit           string
		max, excess, confirmd int
	}{{"", "messages", 3, 0, 3}, {"", "bytes", 260, 10, 260}, {"alarms", "messages", 2, 1, 2}}
	for i, w := range want {
		got := d.Windows[i]
		if got.Class != w.class || got.Unit != w.unit || got.MaxInWindow != w.max || got.Excess != w.excess || got.Confirmed != w.confirmd {
			t.Errorf("window %d: %+v, want %+v", i, got, w)
		}
	}
	// The first violated window is the device's verdict.
	if !d.Violation() || d.Limit != 250 || d.Excess != 10 || d.ConfirmedExcess != 10 {
		t.Fatalf("device verdict %+v: want the byte window's excess of 10", d)
	}
	// Within every window: no violation.
	l.Sent, l.Arrivals = l.Sent[:0], l.Arrivals[:0]
	send(0, 0, 100, "")
	send(1, 100, 150, "")
	send(2, 300, 5000, "alarms")
	send(3, 1400, 5000, "alarms")
	if d, _ := checkDevice(l, CheckOptions{}, nil); d.Violation() || d.Excess != 0 {
		t.Fatalf("within every window: %+v", d)
	}
}

// TestMaxInWindowMatchesBruteForce: the weighted two-pointer count of
// messages or bytes equals a count over every window start.
func TestMaxInWindowMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for iter := range 2000 {
		pts := make([]point, r.IntN(30))
		at := 0
		for i := range pts {
			at += r.IntN(400)
			pts[i] = point{at: ms(at), size: r.IntN(3) * r.IntN(200)}
		}
		w := devicelimit.Limit{Unit: devicelimit.Unit(r.IntN(2)), N: 1, Window: time.Duration(r.IntN(2000)) * time.Millisecond}
		want := 0
		for i := range pts {
			n := w.Units(pts[i].size) // a window starting at an arrival holds it, even of length 0
			for j := i + 1; j < len(pts) && pts[j].at.Sub(pts[i].at) < w.Window; j++ {
				n += w.Units(pts[j].size)
			}
			want = max(want, n)
		}
		if got, _ := maxInWindow(pts, w, w.Window); got != want {
			t.Fatalf("iter %d (%v): got %d, brute force %d", iter, w, got, want)
		}
	}
}

// TestRunSeveralWindowsAndClasses drives a real gateway whose devices
// have a message and a byte window and a topic class for alarms: the
// run is clean, the byte window and the class refuse their share, and
// every device's three windows are judged. Told a stricter byte window
// than the gateway's, the checker finds the excess in bytes.
func TestRunSeveralWindowsAndClasses(t *testing.T) {
	own := devicelimit.WithWindows(devicelimit.PolicyDrop,
		devicelimit.Limit{N: 20, Window: time.Second}, devicelimit.Limit{Unit: devicelimit.Bytes, N: 1000, Window: time.Second})
	alarms := devicelimit.Quota{Limit: 2, Window: time.Second}
	srv := startServerClasses(t, own, []devicelimit.Class{{Name: "alarms", Topics: []string{"devices/+/alarm/#"}, Quota: alarms}})
	cfg := Config{
		Addr: srv.Addr().String(), Devices: 10, Rate: 20, QoS: 1, PayloadSize: 100,
		Duration: 2500 * time.Millisecond, Quota: own, Seed: 1, Tolerance: 150 * time.Millisecond,
		// Every 5th message an alarm: 4 alarms and 16 telemetry messages
		// of 100 bytes a second, against 2 alarms and 1000 bytes.
		TopicClasses: []TopicClass{{Name: "alarms", Topic: "devices/%s/alarm/sim", Every: 5, Quota: alarms}},
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	totalsAddUp(t, rep)
	tt := rep.Result.Totals
	if !rep.Verdict.OK || tt.Violations != 0 || tt.Lost != 0 || tt.Refused == 0 || rep.ConnectFailures != 0 {
		t.Fatalf("want a clean run with refusals: %+v, %v", tt, rep.Errors)
	}
	for _, d := range rep.Result.Devices {
		if len(d.Windows) != 3 || d.Windows[1].Unit != "bytes" || d.Windows[2].Class != "alarms" {
			t.Fatalf("%s: windows %+v, want own messages, own bytes, alarms", d.Device, d.Windows)
		}
		if b, a := d.Windows[1].Confirmed, d.Windows[2].Confirmed; b < 500 || b > 1000 || a < 1 || a > 2 {
			t.Fatalf("%s: %d bytes and %d alarms confirmed in a window, want up to 1000 and 2, and some", d.Device, b, a)
		}
	}
	// The checker judges by what it is told: 800 bytes is stricter than
	// the gateway's 1000.
	cfg.Quota = devicelimit.WithWindows(devicelimit.PolicyDrop,
		devicelimit.Limit{N: 20, Window: time.Second}, devicelimit.Limit{Unit: devicelimit.Bytes, N: 800, Window: time.Second})
	cfg.Duration = 1500 * time.Millisecond
	if rep, err = Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if rep.Verdict.OK || rep.Result.Totals.Violations == 0 {
		t.Fatalf("a stricter byte window than the gateway's: %+v, want violations", rep.Result.Totals)
	}
	for _, d := range Worst(rep.Result, 3) {
		if d.Limit != 800 || d.Excess < 100 {
			t.Fatalf("%s judged by limit %d with excess %d: want the byte window's", d.Device, d.Limit, d.Excess)
		}
	}
	var b strings.Builder
	if err := rep.WriteSummary(&b); err != nil || !strings.Contains(b.String(), "800 bytes/1s:drop") {
		t.Fatalf("summary names the judged window? %v\n%s", err, b.String())
	}
}

// TestRunReportsBlockedDevices: against a gateway that blocks a device
// refused 3 times within a second, flooding devices are reported
// blocked (not as faults), the run's verdict stays OK, and a device
// within its quota is served all along.
func TestRunReportsBlockedDevices(t *testing.T) {
	q := devicelimit.Quota{Limit: 2, Window: time.Second,
		Block: devicelimit.Block{After: 3, Within: time.Second, For: time.Hour}}
	srv := startServerClasses(t, q, nil)
	cfg := Config{
		Addr: srv.Addr().String(), Devices: 3, Rate: 20, QoS: 1, Duration: 1500 * time.Millisecond,
		Quota: q, Seed: 1, Tolerance: 150 * time.Millisecond,
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Blocked) != 3 || rep.Disconnects != 0 || !rep.Verdict.OK {
		t.Fatalf("blocked %v, disconnects %d, verdict %+v (errors %v); want the 3 flooding devices blocked, a clean verdict",
			rep.Blocked, rep.Disconnects, rep.Verdict, rep.Errors)
	}
	var b strings.Builder
	if err := rep.WriteSummary(&b); err != nil || !strings.Contains(b.String(), "3 devices were blocked by the gateway") {
		t.Fatalf("summary: %v\n%s", err, b.String())
	}
	// A device within its quota is not blocked.
	cfg.Devices, cfg.Rate, cfg.IDPattern = 1, 1, "calm-%02d"
	if rep, err = Run(context.Background(), cfg); err != nil || len(rep.Blocked) != 0 || rep.Result.Totals.Refused != 0 {
		t.Fatalf("a calm device: %v, blocked %v, totals %+v", err, rep.Blocked, rep.Result.Totals)
	}
}
