package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/simulator"
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

// TestSimulateMixDefer runs a fleet of two classes on an embedded
// gateway: half on 20/1s drop (the default), half on 5/1s defer (set as
// overrides). Deferred messages come out later and are counted as
// released, and every device is judged against its own quota.
func TestSimulateMixDefer(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "r.json")
	code, stdout, stderr := runBinary(t, "simulate", "--embedded", "--devices", "20", "--rate", "10/s",
		"--duration", "2s", "--limit", "20", "--window", "1s", "--mix", "50%:20/1s:drop,50%:5/1s:defer",
		"--tolerance", "100ms", "--json", jsonPath)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	rep := readReport(t, jsonPath)
	checkAddsUp(t, rep)
	for _, d := range rep.Result.Devices {
		deferClass := d.Device >= "dev-00010"
		switch {
		// A message deferred only briefly arrives within 250 ms and
		// counts as accepted, so the split between accepted and released
		// is not fixed; that some were released is.
		case deferClass && (d.Limit != 5 || d.Policy != "defer" || d.Released == 0 || d.Refused != 0):
			t.Errorf("%s in the defer class: %+v", d.Device, d)
		case !deferClass && (d.Limit != 20 || d.Policy != "drop" || d.Deferred != 0 || d.Accepted != d.Sent):
			t.Errorf("%s in the drop class: %+v", d.Device, d)
		case d.MaxInWindow > d.Limit:
			t.Errorf("%s: %d in a window, limit %d", d.Device, d.MaxInWindow, d.Limit)
		}
	}
}

// TestSimulateClockStepAcrossRestart restarts the embedded gateway mid
// run with its wall clock an hour behind: windows keep counting from
// the persisted high-water, so no device gets a fresh quota.
func TestSimulateClockStepAcrossRestart(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "r.json")
	code, stdout, stderr := runBinary(t, "simulate", "--embedded", "--devices", "20", "--rate", "10/s",
		"--duration", "3s", "--limit", "15", "--window", "10s", "--restart-at", "1s", "--clock-step", "-1h",
		"--tolerance", "100ms", "--json", jsonPath)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	rep := readReport(t, jsonPath)
	checkAddsUp(t, rep)
	tot := rep.Result.Totals
	if len(rep.Restarts) != 1 || rep.Restarts[0].Err != "" || rep.Reconnects != 20 {
		t.Fatalf("restarts %+v, reconnects %d", rep.Restarts, rep.Reconnects)
	}
	// 15 of 10/s in a 10 s window: a device is full at 1.5 s and stays
	// refused after the restart; a reset window would admit 15 more. How
	// many a device sends before and after the restart depends on the
	// machine's load (messages due during the restart are skipped), so
	// the test does not count on every device filling its window: none
	// is over it, and one refused had its 15 admitted, less those the
	// restart cut off before their answer (unacked: the gateway may have
	// counted them).
	if tot.Violations != 0 || tot.WithinBound != 0 || tot.Refused == 0 {
		t.Fatalf("totals %+v", tot)
	}
	for _, d := range rep.Result.Devices {
		if d.Accepted > 15 || d.Refused > 0 && d.Accepted+d.Unacked < 15 {
			t.Errorf("%s: %+v; want at most 15 accepted, and 15 accepted or unacked once refused", d.Device, d)
		}
	}
	if !strings.Contains(stdout, "gateway restart (sigterm, wall clock -1h0m0s)") {
		t.Errorf("summary:\n%s", stdout)
	}
}

// TestSimulateEmbeddedConfigFile takes the embedded gateway's quota from
// a config file, and judges the run against it when no quota flag is
// given.
func TestSimulateEmbeddedConfigFile(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "gw.yaml")
	if err := os.WriteFile(cfgPath, []byte("limits:\n  default:\n    limit: 3\n    window: 1s\n    policy: drop\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	jsonPath := filepath.Join(dir, "r.json")
	// "--data-dir=DIR" in one argument: runBinary gives a separate
	// "--data-dir" an --admin-addr, meant for serve.
	code, stdout, stderr := runBinary(t, "simulate", "--embedded", "--config", cfgPath, "--data-dir="+filepath.Join(dir, "data"),
		"--devices", "10", "--rate", "10/s", "--duration", "1500ms", "--tolerance", "100ms", "--json", jsonPath)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	rep := readReport(t, jsonPath)
	checkAddsUp(t, rep)
	if q := rep.Config.Quota; q.Limit != 3 || q.Window != time.Second {
		t.Fatalf("judged against %v, want the file's 3/1s", q)
	}
	if tot := rep.Result.Totals; tot.Refused == 0 || tot.Violations != 0 {
		t.Fatalf("totals %+v", tot)
	}
	// --data-dir is the user's: kept after the run.
	if _, err := os.Stat(filepath.Join(dir, "data", "devicegate.db")); err != nil {
		t.Fatalf("data directory: %v", err)
	}
}

// With a config file and only some quota flags, the gateway enforces the
// file's quota with the given flags over it, and the run is judged by
// that same quota (it used to be judged by the flags' defaults for the
// flags not given: here 5 per 10 s against the 5 per 1 s enforced).
func TestSimulateEmbeddedConfigFileAndSomeQuotaFlags(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "gw.yaml")
	if err := os.WriteFile(cfgPath, []byte("limits:\n  default:\n    limit: 3\n    window: 1s\n    policy: drop\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	jsonPath := filepath.Join(dir, "r.json")
	code, stdout, stderr := runBinary(t, "simulate", "--embedded", "--config", cfgPath, "--limit", "5",
		"--devices", "5", "--rate", "10/s", "--duration", "1500ms", "--tolerance", "100ms", "--json", jsonPath)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	rep := readReport(t, jsonPath)
	checkAddsUp(t, rep)
	if q := rep.Config.Quota; q.Limit != 5 || q.Window != time.Second {
		t.Fatalf("judged against %v, want 5/1s (--limit over the file's 1s window)", q)
	}
	if tot := rep.Result.Totals; tot.Refused == 0 || tot.Violations != 0 {
		t.Fatalf("totals %+v", tot)
	}
}

// TestSimulateUpstreamOutage: `simulate --embedded --upstream embedded`
// counts arrivals at an upstream broker the gateway forwards to, and
// --upstream-outage-at cuts the gateway's link to it for a while: every
// acknowledged message still arrives, in order, the quota holds end to
// end, and the summary, the JSON and the HTML report say so. Against a
// real Mosquitto upstream (an address) the same.
func TestSimulateUpstreamOutage(t *testing.T) {
	for _, up := range []string{"embedded", "mosquitto"} {
		t.Run(up, func(t *testing.T) {
			spec := up
			if up == "mosquitto" {
				spec = mosquittotest.Start(t).Addr
			}
			dir := t.TempDir()
			jsonPath, htmlPath := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.html")
			code, stdout, stderr := runBinary(t, "simulate", "--embedded", "--upstream", spec, "--devices", "50", "--rate", "10/s",
				"--duration", "4s", "--limit", "20", "--window", "1s", "--upstream-outage-at", "1s", "--upstream-outage-for", "2s",
				"--json", jsonPath, "--report", htmlPath)
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			for _, want := range []string{"OK: 0 devices over quota", "arrivals counted upstream at ", "0 out of order", "upstream link down at "} {
				if !strings.Contains(stdout, want) {
					t.Errorf("summary lacks %q:\n%s", want, stdout)
				}
			}
			rep := readReport(t, jsonPath)
			checkAddsUp(t, rep)
			tot := rep.Result.Totals
			if tot.Sent == 0 || tot.Accepted == 0 || tot.Lost != 0 || tot.OutOfOrder != 0 || tot.Violations != 0 || len(rep.Outages) != 1 || rep.Config.SubAddr == "" {
				t.Fatalf("totals %+v, outages %v, sub addr %q", tot, rep.Outages, rep.Config.SubAddr)
			}
			// Messages sent during the outage arrived after it: the
			// latency shows the backlog.
			if tot.LatencyMax < time.Second {
				t.Fatalf("max latency %s: the outage held nothing back", tot.LatencyMax)
			}
			html, err := os.ReadFile(htmlPath)
			if err != nil || !strings.Contains(string(html), "upstream down") {
				t.Fatalf("HTML report lacks the outage: %v", err)
			}
		})
	}
}

// TestSimulateUpstreamFlags: the upstream flags refuse what cannot work.
func TestSimulateUpstreamFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--upstream-outage-at", "1s", "--upstream-outage-for", "1s"}, "--upstream-outage-at: needs --upstream"},
		{[]string{"--upstream", "embedded", "--upstream-outage-at", "1s", "--upstream-outage-for", "1s"}, "a gateway the simulator starts"},
		{[]string{"--embedded", "--upstream", "embedded", "--upstream-outage-at", "1s"}, "--upstream-outage-at and --upstream-outage-for go together"},
		{[]string{"--embedded", "--upstream", "embedded", "--upstream-outage-at", "20s", "--upstream-outage-for", "1s"}, "must be within --duration"},
		{[]string{"--embedded", "--upstream", "upstream.example:1883"}, `--upstream: "embedded" or a loopback host:port (got "upstream.example:1883")`},
	} {
		code, _, stderr := runBinary(t, append([]string{"simulate"}, c.args...)...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, stderr, c.want)
		}
	}
}

// TestSimulateSeveralWindowsAndClasses: simulate judges a gateway
// whose default quota has a message and a byte window and a topic
// class for alarms: every device's three windows are judged, the run
// passes, and the JSON report has each window's verdict. Bad
// --windows and --topic-class are refused naming the flag.
func TestSimulateSeveralWindowsAndClasses(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.yaml")
	yaml := `limits:
  default: {windows: [{messages: 20, window: 1s}, {bytes: 1KiB, window: 1s}]}
  classes: [{name: alarms, topics: ["devices/+/alarm/#"], quota: {limit: 2, window: 1s}}]
`
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(dir, "report.json")
	code, stdout, stderr := runBinary(t, "simulate", "--embedded", "--config", cfg, "--devices", "5", "--rate", "20/s",
		"--payload-size", "100", "--duration", "2s", "--tolerance", "150ms", "--topic-class", "alarms:5", "--json", report)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	var rep struct {
		Result struct {
			Totals  struct{ Sent, Refused, Violations int }
			Devices []struct {
				Windows []struct {
					Class, Unit      string
					Limit, Confirmed int
				}
			}
		}
	}
	b, err := os.ReadFile(report)
	if err == nil {
		err = json.Unmarshal(b, &rep)
	}
	if err != nil || len(rep.Result.Devices) != 5 || rep.Result.Totals.Refused == 0 || rep.Result.Totals.Violations != 0 {
		t.Fatalf("report %+v (%v)", rep.Result.Totals, err)
	}
	for _, d := range rep.Result.Devices {
		if len(d.Windows) != 3 || d.Windows[1].Unit != "bytes" || d.Windows[1].Limit != 1024 || d.Windows[2].Class != "alarms" || d.Windows[2].Confirmed == 0 {
			t.Fatalf("device windows %+v: want own messages, own bytes and alarms judged", d.Windows)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--windows", "10/1s,5XB/1m"}, `--windows: "5XB/1m": "5XB" is neither a message count nor a size`},
		{[]string{"--windows", "10/1s,0/1m"}, `--windows: "0/1m": the count must be at least 1`},
		{[]string{"--topic-class", "alarms:5"}, "--topic-class: only with --embedded or --spawn"},
		{[]string{"--embedded", "--config", cfg, "--topic-class", "alarms"}, `--topic-class: "alarms" is not NAME:EVERY`},
		{[]string{"--embedded", "--config", cfg, "--topic-class", "fire:3"}, `the gateway's limits.classes has no class "fire"`},
	} {
		code, _, stderr := runBinary(t, append([]string{"simulate", "--duration", "1s"}, c.args...)...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, stderr, c.want)
		}
	}
}

// TestSimulateTenantFlood: `gateway simulate --embedded` with a gateway
// whose devices are all in group acme (30 per second) and block a
// device refused 5 times within a second; one of 8 devices floods: it
// is reported blocked, the rest of the tenant is served in full, and
// the group's window is judged and held. Bad --group and --flood are
// refused naming the flag.
func TestSimulateTenantFlood(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.yaml")
	yaml := `limits:
  default: {limit: 5, window: 1s, block: {after: 5, within: 1s, for: 1h}}
  group: {name: acme, quota: {limit: 30, window: 1s}}
`
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(dir, "report.json")
	code, stdout, stderr := runBinary(t, "simulate", "--embedded", "--config", cfg, "--devices", "8", "--rate", "2/s",
		"--group", "acme:30/1s", "--flood", "1:50", "--duration", "2s", "--tolerance", "150ms", "--json", report)
	if code != 0 || !strings.Contains(stdout, "group acme (8 devices): 30 messages per 1s: at most ") ||
		!strings.Contains(stdout, "1 device was blocked by the gateway (automatic blocking) and stopped: dev-00000") {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	var rep struct {
		Blocked []string
		Result  struct {
			Devices []struct {
				Device   string
				Sent     int
				Accepted int
			}
			Groups []struct {
				Violated bool
				Windows  []struct{ MaxInWindow int }
			}
		}
	}
	b, err := os.ReadFile(report)
	if err == nil {
		err = json.Unmarshal(b, &rep)
	}
	if err != nil || len(rep.Result.Groups) != 1 || rep.Result.Groups[0].Violated || rep.Result.Groups[0].Windows[0].MaxInWindow > 30 {
		t.Fatalf("report groups %+v (%v)", rep.Result.Groups, err)
	}
	for _, d := range rep.Result.Devices[1:] {
		if d.Accepted != d.Sent || d.Sent == 0 {
			t.Errorf("%s: accepted %d of %d; the rest of the tenant should be served in full", d.Device, d.Accepted, d.Sent)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--group", "acme"}, `--group: want NAME:WINDOWS`},
		{[]string{"--group", "acme:0/1s"}, `--group: want NAME:WINDOWS`},
		{[]string{"--flood", "1"}, `--flood: want N:RATE`},
		{[]string{"--flood", "20:5"}, `--flood: must be between 0 and the fleet's 10 devices`},
	} {
		code, _, stderr := runBinary(t, append([]string{"simulate", "--duration", "1s"}, c.args...)...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, stderr, c.want)
		}
	}
}
