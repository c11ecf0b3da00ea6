package main

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSimulateProcess runs `gateway simulate` against a gateway child
// that enforces 5 messages a second: judged against that quota the run
// passes, judged against a stricter one it fails naming devices. The
// two runs use their own device IDs, and by default their own topics
// (a run ID in each), so they run side by side: on shared topics each
// run's subscriber would count the other's devices as phantoms.
func TestSimulateProcess(t *testing.T) {
	dir := t.TempDir()
	gw := start(t, "serve", "--mqtt-addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"),
		"--admin-addr", "127.0.0.1:0", "--limit", "5", "--window", "1s")
	addr := gw.waitLine(listeningRE, 10*time.Second)[1]

	type outcome struct {
		code           int
		stdout, stderr string
	}
	var ok, strict outcome
	jsonPath := filepath.Join(dir, "r.json")
	var wg sync.WaitGroup
	wg.Go(func() {
		ok.code, ok.stdout, ok.stderr = runBinary(t, "simulate", "--addr", addr, "--devices", "20", "--rate", "10/s",
			"--duration", "3s", "--limit", "5", "--window", "1s", "--json", jsonPath)
	})
	wg.Go(func() {
		strict.code, strict.stdout, strict.stderr = runBinary(t, "simulate", "--addr", addr, "--id-pattern", "strict-%03d",
			"--devices", "10", "--rate", "10", "--duration", "2s", "--limit", "3", "--window", "1s")
	})
	wg.Wait()

	if ok.code != 0 {
		t.Fatalf("simulate judged against the gateway's quota: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", ok.code, ok.stdout, ok.stderr)
	}
	if !strings.Contains(ok.stdout, "OK: 0 devices over quota") {
		t.Errorf("summary lacks the OK verdict:\n%s", ok.stdout)
	}
	rep := readReport(t, jsonPath)
	checkAddsUp(t, rep)
	tot := rep.Result.Totals
	if tot.Devices != 20 || tot.Sent == 0 {
		t.Errorf("totals %+v: want 20 devices that sent", tot)
	}
	if tot.Refused == 0 {
		t.Errorf("no message refused at 10/s against 5/1s: %+v", tot)
	}
	if tot.Violations != 0 || !rep.Verdict.OK {
		t.Errorf("violations %d, verdict %+v; want none, OK", tot.Violations, rep.Verdict)
	}
	if rep.Config.Quota.Limit != 5 || rep.Config.Quota.Window != time.Second {
		t.Errorf("report's quota %v, want 5/1s", rep.Config.Quota)
	}
	// The quota's keys are the report's: snake_case, durations in _ns.
	if raw, err := os.ReadFile(jsonPath); err != nil || !strings.Contains(string(raw), `"quota": {
      "limit": 5,
      "window_ns": 1000000000,
      "policy": "drop"
    }`) || strings.Contains(string(raw), "NWindows") {
		t.Errorf("report's config.quota is not in the report's form (%v):\n%.600s", err, raw)
	}

	if strict.code != 1 {
		t.Fatalf("simulate judged against 3/1s: exit %d, want 1\nstdout:\n%s\nstderr:\n%s", strict.code, strict.stdout, strict.stderr)
	}
	if !strings.Contains(strict.stdout, "FAIL:") || !strings.Contains(strict.stderr, "worst devices: strict-") {
		t.Errorf("failed run should print FAIL and name devices on stderr\nstdout:\n%s\nstderr:\n%s", strict.stdout, strict.stderr)
	}
}

func TestSimulateBadFlagsProcess(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--devices", "0"}, "--devices: must be > 0"},
		{[]string{"--devices", "x"}, "-devices"},
		{[]string{"--rate", "fast"}, "-rate"},
		{[]string{"--rate", "0/s"}, "-rate"},
		{[]string{"--qos", "3"}, "--qos: must be 0, 1 or 2"},
		{[]string{"--mix", "70%:50/10s"}, "--mix: the shares add up to 70%"},
		{[]string{"--mix", "70%:50/10s:queue,30%:1/1s"}, "the policy must be drop, defer or disconnect"},
		{[]string{"--embedded", "--spawn"}, "choose one"},
		{[]string{"--embedded", "--addr", "127.0.0.1:1"}, "--addr: not with --embedded"},
		{[]string{"--data-dir", "x"}, "--data-dir: only with --embedded or --spawn"},
		{[]string{"--restart-at", "1s"}, "--restart-at: needs a gateway the simulator starts"},
		{[]string{"--embedded", "--restart-at", "1s", "--restart", "kill"}, "--restart kill: only with --spawn"},
		{[]string{"--spawn", "--restart-at", "1s", "--restart", "hup"}, "--restart: must be sigterm or kill"},
		{[]string{"--spawn", "--restart-at", "20s"}, "--restart-at: must be within --duration"},
		{[]string{"--storm-at", "1h"}, "--storm-at: must be within --duration"},
		{[]string{"--spawn", "--restart-at", "1s", "--clock-step", "-1h"}, "--clock-step: only with --embedded"},
		{[]string{"--admin-token", "x"}, "--admin-token: only with --admin-addr"},
		{[]string{"--protocol", "3"}, "-protocol"},
		{[]string{"--pattern", "zigzag"}, "--pattern"},
		{[]string{"--pattern", "burst"}, "--burst"},
		{[]string{"--policy", "queue"}, "--policy"},
		{[]string{"--limit", "0"}, "--limit"},
		{[]string{"--window", "1"}, "-window"},
		{[]string{"--duration", "0s"}, "--duration"},
		{[]string{"--topic", "devices"}, "--topic"},
		{[]string{"--addr", "broker.example:1883"}, "--addr"},
		{[]string{"--addr", "nonsense"}, "--addr"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		code, stdout, stderr := runBinary(t, append([]string{"simulate"}, tc.args...)...)
		if code != 2 || !strings.Contains(stderr, tc.want) || stdout != "" {
			t.Errorf("simulate %v: exit %d, stderr %q, stdout %q; want exit 2 naming %q", tc.args, code, stderr, stdout, tc.want)
		}
	}
	if code, _, stderr := runBinary(t, "simulate", "--embedded", "--config", "/nonexistent.yaml"); code != 1 || !strings.Contains(stderr, "/nonexistent.yaml") {
		t.Errorf("embedded with a missing config file: exit %d, stderr %q", code, stderr)
	}
	code, stdout, _ := runBinary(t, "help", "simulate")
	if code != 0 || !strings.Contains(stdout, "--limit") || !strings.Contains(stdout, "--json") {
		t.Errorf("help simulate: exit %d\n%s", code, stdout)
	}
}

// TestSimulateMixThroughAdminAPI runs a mix against a running gateway:
// the devices of the stricter class get their overrides through the
// admin API, and each device is judged against its own class's quota.
// Stdout is a pipe, so there is no progress line.
func TestSimulateMixThroughAdminAPI(t *testing.T) {
	g := startGW(t, t.TempDir(), "--limit", "20", "--window", "1s")
	jsonPath := filepath.Join(t.TempDir(), "r.json")
	code, stdout, stderr := runBinary(t, "simulate", "--addr", g.mqtt, "--admin-addr", g.admin, "--admin-token", g.token,
		"--devices", "10", "--rate", "10/s", "--duration", "2s", "--limit", "20", "--window", "1s",
		"--mix", "50%:20/1s,50%:3/1s", "--tolerance", "100ms", "--json", jsonPath)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if strings.ContainsAny(stdout, "\r\033") {
		t.Errorf("progress line on a pipe:\n%q", stdout)
	}
	rep := readReport(t, jsonPath)
	checkAddsUp(t, rep)
	for _, d := range rep.Result.Devices {
		want := 20
		if d.Device >= "dev-00005" {
			want = 3
		}
		if d.Limit != want || d.MaxInWindow > want || (want == 3 && d.Refused == 0) || (want == 20 && d.Refused != 0) {
			t.Errorf("%s: %+v, want limit %d", d.Device, d, want)
		}
	}
	if st, m := g.call(t, "GET", "/api/v1/devices/dev-00007", ""); st != 200 || m["source"] != "override" {
		t.Errorf("dev-00007 after the run: HTTP %d %v, want its override", st, m)
	}
	// A wrong token fails before any device connects, naming the API.
	code, _, stderr = runBinary(t, "simulate", "--addr", g.mqtt, "--admin-addr", g.admin, "--admin-token", "wrong",
		"--devices", "2", "--duration", "1s", "--mix", "50%:20/1s,50%:3/1s")
	if code != 1 || !strings.Contains(stderr, "--mix: set the quota of dev-00000") || !strings.Contains(stderr, "401") {
		t.Errorf("wrong token: exit %d, stderr %q", code, stderr)
	}
}
