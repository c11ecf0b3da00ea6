package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"devicegate/simulator"
)

// readReport decodes a --json report.
func readReport(t *testing.T, path string) *simulator.Report {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep simulator.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("--json: %v", err)
	}
	return &rep
}

// checkAddsUp fails unless the totals partition what was sent.
func checkAddsUp(t *testing.T, rep *simulator.Report) {
	t.Helper()
	tot := rep.Result.Totals
	if sum := tot.Accepted + tot.Refused + tot.Deferred + tot.Lost + tot.Unacked; sum != tot.Sent || tot.Released+tot.Pending != tot.Deferred {
		t.Fatalf("accepted %d + refused %d + deferred %d (released %d + pending %d) + lost %d + unacked %d = %d, want sent %d",
			tot.Accepted, tot.Refused, tot.Deferred, tot.Released, tot.Pending, tot.Lost, tot.Unacked, sum, tot.Sent)
	}
}

// TestSimulateEmbedded is the acceptance run of `simulate --embedded`,
// shortened: a gateway in the simulator's process, in a temporary data
// directory, enforcing the quota the run is judged against.
func TestSimulateEmbedded(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "r.json")
	code, stdout, stderr := runBinary(t, "simulate", "--embedded", "--devices", "50", "--rate", "10/s",
		"--duration", "2s", "--limit", "10", "--window", "1s", "--json", jsonPath)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "OK: 0 devices over quota") || !strings.Contains(stdout, "sent ") {
		t.Errorf("summary:\n%s", stdout)
	}
	rep := readReport(t, jsonPath)
	checkAddsUp(t, rep)
	tot := rep.Result.Totals
	if tot.Devices != 50 || tot.Sent == 0 || tot.Refused == 0 || tot.Violations != 0 || tot.Lost != 0 || tot.Unacked != 0 {
		t.Fatalf("totals %+v", tot)
	}
}
