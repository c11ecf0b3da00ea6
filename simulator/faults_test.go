package simulator

import (
	"context"
	"testing"
	"time"

	"devicegate/devicelimit"
)

// TestRunReconnectStormQoS2 drops and reconnects every device mid-run,
// publishing at QoS 2: windows live in the gateway, so the quota holds
// across the storm, and every device is back.
func TestRunReconnectStormQoS2(t *testing.T) {
	q := devicelimit.Quota{Limit: 5, Window: time.Second, Policy: devicelimit.PolicyDrop}
	addr := startGateway(t, q)
	var progress []Progress
	rep, err := Run(context.Background(), Config{
		Addr: addr, Devices: 20, Rate: 10, QoS: 2, Duration: 2 * time.Second, Faults: Faults{StormAt: time.Second},
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
		t.Fatalf("progress called %d times in 2 s, want every 300 ms", len(progress))
	}
	last := progress[len(progress)-1]
	if last.Connected != 20 || last.Sent == 0 || last.Refused == 0 || last.Over != 0 {
		t.Fatalf("last progress %+v", last)
	}
}

// TestAllowances counts, per device, the distinct messages that arrived
// in the crash-loss period before each restart.
func TestAllowances(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	logs := []DeviceLog{
		{Device: "a", Arrivals: []Arrival{{0, at(100)}, {1, at(900)}, {2, at(1500)}, {2, at(1600)}, {3, at(2000)}, {4, at(2001)}}},
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
		Sent:      []Sent{{0, at(0), AckSuccess, 0}, {1, at(10), AckSuccess, 0}, {2, at(20), AckSuccess, 0}},
		Arrivals:  []Arrival{{0, at(1)}, {1, at(11)}, {2, at(21)}},
		Allowance: 2}}, CheckOptions{})
	if d := res.Devices[0]; d.Excess != 2 || d.Violation() || res.Totals.Violations != 0 || res.Totals.WithinBound != 1 || !Decide(res, 1).OK {
		t.Fatalf("excess within the allowance: %+v, totals %+v", d, res.Totals)
	}
}
