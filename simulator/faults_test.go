package simulator

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestRunReconnectStormQoS2 drops and reconnects every device mid-run,
// publishing at QoS 2: windows live in the gateway, so the quota holds
// across the storm, and every device is back.
func TestRunReconnectStormQoS2(t *testing.T) {
	// A device drops its connection when its schedule reaches the storm:
	// a device behind schedule (QoS 2 round trips on a loaded machine
	// kept 200 messages a second at 75 %) reached it after the run's end
	// and never reconnected. At 5/s it has the slack to be on time.
	q := devicelimit.Quota{Limit: 2, Window: time.Second, Policy: devicelimit.PolicyDrop}
	addr := startGateway(t, q)
	var progress []Progress
	rep, err := Run(context.Background(), Config{
		Addr: addr, Devices: 20, Rate: 5, QoS: 2, Duration: 3 * time.Second, Faults: Faults{StormAt: time.Second},
		Drain: 500 * time.Millisecond, Quota: q, Tolerance: 100 * time.Millisecond,
		Progress: func(p Progress) { progress = append(progress, p) }, ProgressEvery: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	totalsAddUp(t, rep)
	tt := rep.Result.Totals
	if rep.Reconnects != 20 || rep.Disconnects != 0 || rep.ConnectFailures != 0 {
		t.Fatalf("reconnects %d, disconnects %d, connect failures %d: %v", rep.Reconnects, rep.Disconnects, rep.ConnectFailures, rep.Errors)
	}
	// QoS 2 at MQTT 5: the PUBREC carries the verdict.
	if tt.Violations != 0 || tt.Refused == 0 || tt.Accepted == 0 || tt.Unacked != 0 || !rep.Verdict.OK {
		t.Fatalf("got %+v, verdict %+v", tt, rep.Verdict)
	}
	if len(progress) < 3 {
		t.Fatalf("progress called %d times in 3 s, want every 300 ms", len(progress))
	}
	// Every device is back after the storm: some report after it shows
	// all 20 connected (the last may be taken while the fleet hangs up).
	back := false
	for _, p := range progress {
		back = back || p.Elapsed > time.Second && p.Connected == 20
	}
	// The progress line's quick check counts every arrival in a window
	// of T minus the tolerance; the verdict (Check) also wants the send
	// and ack times to confirm an excess, and counts first arrivals. On
	// a loaded machine deliveries bunch up at the subscriber, so the
	// quick check may see over quota only the devices whose arrivals
	// were over quota (MaxInWindow) or arrived twice.
	overByArrivals := 0
	for _, d := range rep.Result.Devices {
		if d.MaxInWindow > d.Limit || d.Duplicated > 0 {
			overByArrivals++
		}
	}
	last := progress[len(progress)-1]
	if !back || last.Sent == 0 || last.Refused == 0 || last.Over > overByArrivals {
		t.Fatalf("no report with all 20 back after the storm (%v), or last progress %+v with %d devices over quota by arrivals", back, last, overByArrivals)
	}
	t.Logf("last progress %+v; %d devices over quota by arrivals", last, overByArrivals)
}

// TestAllowances counts, per device, the distinct messages that arrived
// in the crash-loss period before each restart.
func TestAllowances(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	logs := []DeviceLog{
		{Device: "a", Arrivals: []Arrival{{Seq: 0, At: at(100)}, {Seq: 1, At: at(900)}, {Seq: 2, At: at(1500)}, {Seq: 2, At: at(1600)}, {Seq: 3, At: at(2000)}, {Seq: 4, At: at(2001)}}},
		{Device: "b"},
	}
	restarts := []RestartEvent{{At: at(2000)}}
	allowances(logs, restarts, time.Second)
	// (1000, 2000]: seq 2 (twice) and 3.
	if logs[0].Allowance != 2 || logs[1].Allowance != 0 {
		t.Fatalf("allowances %d, %d; want 2, 0", logs[0].Allowance, logs[1].Allowance)
	}
	allowances(logs, restarts, 0)
	if logs[0].Allowance != 2 {
		t.Fatal("no crash loss must change nothing")
	}
	res := Check([]DeviceLog{{Device: "c", Quota: devicelimit.Quota{Limit: 1, Window: time.Second},
		Sent:      []Sent{{Seq: 0, At: at(0), Ack: AckSuccess}, {Seq: 1, At: at(10), Ack: AckSuccess}, {Seq: 2, At: at(20), Ack: AckSuccess}},
		Arrivals:  []Arrival{{Seq: 0, At: at(1)}, {Seq: 1, At: at(11)}, {Seq: 2, At: at(21)}},
		Allowance: 2}}, CheckOptions{})
	if d := res.Devices[0]; d.Excess != 2 || d.Violation() || res.Totals.Violations != 0 || res.Totals.WithinBound != 1 || !Decide(res, 1).OK {
		t.Fatalf("excess within the allowance: %+v, totals %+v", d, res.Totals)
	}
}

// TestConfirmedIgnoresLateDeliveries: a device sends one message every
// 400 ms against 3 per second, each acked within 5 ms; the subscriber
// falls behind and gets six of them at once. The arrival check sees 6
// in a window; the timestamps confirm only 3, the limit: no violation.
// A gateway that admits 4 within 900 ms is confirmed over quota.
func TestConfirmedIgnoresLateDeliveries(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	q := devicelimit.Quota{Limit: 3, Window: time.Second}
	l := DeviceLog{Device: "a", Quota: q}
	for i := range 6 {
		l.Sent = append(l.Sent, Sent{Seq: uint64(i), At: at(400 * i), Ack: AckSuccess, AckAt: at(400*i + 5)})
		l.Arrivals = append(l.Arrivals, Arrival{Seq: uint64(i), At: at(2500 + i)})
	}
	late := Check([]DeviceLog{l}, CheckOptions{Tolerance: 50 * time.Millisecond})
	if d := late.Devices[0]; d.MaxInWindow != 6 || d.Excess != 3 || d.Confirmed != 3 || d.ConfirmedExcess != 0 || d.Violation() {
		t.Fatalf("late deliveries: max %d excess %d confirmed %d (%d over), violation %v", d.MaxInWindow, d.Excess, d.Confirmed, d.ConfirmedExcess, d.Violation())
	}
	if tt := late.Totals; tt.Violations != 0 || tt.Unconfirmed != 1 || !Decide(late, 1).OK {
		t.Fatalf("late deliveries: totals %+v", tt)
	}
	fast := DeviceLog{Device: "b", Quota: q}
	for i := range 4 {
		fast.Sent = append(fast.Sent, Sent{Seq: uint64(i), At: at(300 * i), Ack: AckSuccess, AckAt: at(300*i + 2)})
		fast.Arrivals = append(fast.Arrivals, Arrival{Seq: uint64(i), At: at(300*i + 1)})
	}
	res := Check([]DeviceLog{fast}, CheckOptions{})
	if d := res.Devices[0]; d.Confirmed != 4 || d.ConfirmedExcess != 1 || res.Totals.Violations != 1 || Decide(res, 1).OK {
		t.Fatalf("4 admitted within 900 ms: confirmed %d (%d over), totals %+v", d.Confirmed, d.ConfirmedExcess, res.Totals)
	}
}

// TestConfirmedMatchesBruteForce checks the n log n count against the
// definition on random logs.
func TestConfirmedMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for iter := range 300 {
		q := devicelimit.Quota{Limit: 3, Window: time.Duration(1+rng.IntN(50)) * time.Millisecond}
		l := DeviceLog{Device: "a", Quota: q}
		first := map[uint64]time.Time{}
		at := t0
		for i := range rng.IntN(40) {
			at = at.Add(time.Duration(rng.IntN(10)) * time.Millisecond)
			s := Sent{Seq: uint64(i), At: at, Ack: AckSuccess}
			if rng.IntN(2) == 0 {
				s.AckAt = at.Add(time.Duration(rng.IntN(30)) * time.Millisecond)
			}
			l.Sent = append(l.Sent, s)
			first[uint64(i)] = at.Add(time.Duration(rng.IntN(30)) * time.Millisecond)
		}
		want := 0
		for _, a := range l.Sent {
			end := a.At.Add(q.Window)
			n := 0
			for _, b := range l.Sent {
				hi := first[b.Seq]
				if !b.AckAt.IsZero() && b.AckAt.Before(hi) {
					hi = b.AckAt
				}
				if !b.At.Before(a.At) && hi.Before(end) {
					n++
				}
			}
			want = max(want, n)
		}
		if got, _ := confirmed(l, first, 0, false, "", l.Quota.Limits()[0]); got != want {
			t.Fatalf("iter %d: confirmed %d, brute force %d", iter, got, want)
		}
	}
}
