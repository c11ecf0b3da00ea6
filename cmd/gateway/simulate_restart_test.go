package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestSimulateRestartProcess restarts a gateway the simulator runs as a
// child process, mid-run, gracefully and with kill -9. Devices publish
// at 10/s against 15 per 10 s: full at 1.5 s, refused after. A graceful
// restart keeps every window (no excess); kill -9 may forget what was
// admitted since the last snapshot, and the excess must stay within
// that bound.
func TestSimulateRestartProcess(t *testing.T) {
	for _, tc := range []struct {
		mode    string
		restart string
	}{
		{"sigterm", "sigterm"},
		{"kill -9", "kill"},
	} {
		t.Run(tc.restart, func(t *testing.T) {
			t.Parallel()
			jsonPath := filepath.Join(t.TempDir(), "r.json")
			code, stdout, stderr := runBinary(t, "simulate", "--spawn", "--devices", "20", "--rate", "10/s",
				"--duration", "3s", "--limit", "15", "--window", "10s", "--restart-at", "1200ms", "--restart", tc.restart,
				"--snapshot-interval", "500ms", "--tolerance", "100ms", "--json", jsonPath)
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			rep := readReport(t, jsonPath)
			checkAddsUp(t, rep)
			tot := rep.Result.Totals
			if len(rep.Restarts) != 1 || rep.Restarts[0].Mode != tc.mode || rep.Restarts[0].Err != "" || rep.Reconnects != 20 {
				t.Fatalf("restarts %+v, reconnects %d, errors %v", rep.Restarts, rep.Reconnects, rep.Errors)
			}
			if tot.Violations != 0 || tot.Lost != 0 {
				t.Fatalf("totals %+v", tot)
			}
			switch tc.restart {
			case "sigterm":
				if tot.WithinBound != 0 || rep.Config.CrashLoss != 0 {
					t.Fatalf("a graceful restart must keep every window: %+v", tot)
				}
			case "kill":
				// The bound: what arrived in one snapshot interval (plus
				// slack) before the kill: 10/s over 0.85 s, 9 or 10 on a
				// quiet machine. A gateway that forgot every window would
				// let 12 more through (15 minus the 3 refused by 1.2 s),
				// so an excess over 10 fails whatever the allowance: the
				// allowance counts arrivals, which a loaded machine
				// bunches (11 in the interval at load 20).
				for _, d := range rep.Result.Devices {
					if d.Excess > d.Allowance || d.Excess > 10 {
						t.Errorf("%s: excess %d, allowance %d", d.Device, d.Excess, d.Allowance)
					}
				}
				if !strings.Contains(stdout, "persistence bound:") {
					t.Errorf("summary lacks the bound:\n%s", stdout)
				}
			}
			t.Logf("%s: excess %d in all, at most %d, %d devices within the bound", tc.mode, tot.ExcessTotal, tot.MaxExcess, tot.WithinBound)
		})
	}
}

// TestSimulateSpawnMix sets a mix's overrides through the admin API of
// a gateway the simulator spawned (token from its data directory).
func TestSimulateSpawnMix(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "r.json")
	code, stdout, stderr := runBinary(t, "simulate", "--spawn", "--devices", "10", "--rate", "10/s", "--duration", "1500ms",
		"--limit", "20", "--window", "1s", "--mix", "50%:20/1s,50%:2/1s", "--tolerance", "100ms", "--json", jsonPath)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	rep := readReport(t, jsonPath)
	checkAddsUp(t, rep)
	for _, d := range rep.Result.Devices {
		strict := d.Device >= "dev-00005"
		if strict && (d.Limit != 2 || d.Refused == 0) || !strict && (d.Limit != 20 || d.Refused != 0) {
			t.Errorf("%s: %+v", d.Device, d)
		}
	}
}
