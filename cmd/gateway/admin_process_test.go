package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/devicegate/devicegate/internal/mosquittotest"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/admin"
)

// The process tests of the admin API and the metrics: a real gateway
// child process, real MQTT 5 clients, real HTTP.

var adminListeningRE = regexp.MustCompile(`level=INFO msg="admin listening" addr=(\S+)`)

// gw is a running gateway child process and how to reach it.
type gw struct {
	*process
	dir   string // data directory
	mqtt  string // MQTT address
	admin string // admin API address
	token string
}

// startGW runs a gateway on dir with MQTT and the admin API on free
// ports, plus args, and returns it once both listen, with the token it
// created in dir.
func startGW(t *testing.T, dir string, args ...string) *gw {
	t.Helper()
	p := start(t, append([]string{"serve", "--mqtt-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--data-dir", dir}, args...)...)
	g := &gw{process: p, dir: dir}
	g.mqtt = p.waitLine(listeningRE, 10*time.Second)[1]
	g.admin = p.waitLine(adminListeningRE, 10*time.Second)[1]
	if strings.HasSuffix(g.admin, ":0") {
		t.Fatalf("logged admin addr %q, want the bound port", g.admin)
	}
	b, err := os.ReadFile(filepath.Join(dir, admin.TokenFile))
	if err != nil {
		t.Fatalf("token file: %v; stderr:\n%s", err, p.stderr())
	}
	g.token = strings.TrimSpace(string(b))
	if strings.Contains(p.stderr(), g.token) {
		t.Fatalf("the token is in the log:\n%s", p.stderr())
	}
	return g
}

// call sends a request to the admin API with the gateway's token and
// returns the status and the decoded JSON body.
func (g *gw) call(t *testing.T, method, path, body string) (int, map[string]any) {
	t.Helper()
	return g.callAs(t, g.token, method, path, body)
}

func (g *gw) callAs(t *testing.T, token, method, path, body string) (int, map[string]any) {
	t.Helper()
	code, b := g.raw(t, token, method, path, body)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s %s: HTTP %d, body %q is not a JSON object", method, path, code, b)
	}
	return code, m
}

func (g *gw) raw(t *testing.T, token, method, path, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://"+g.admin+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// mustCall is call that fails the test unless the status is want.
func (g *gw) mustCall(t *testing.T, want int, method, path, body string) map[string]any {
	t.Helper()
	code, m := g.call(t, method, path, body)
	if code != want {
		t.Fatalf("%s %s %s: HTTP %d %v, want %d", method, path, body, code, m, want)
	}
	return m
}

func devicePath(id string) string { return "/api/v1/devices/" + url.PathEscape(id) }

// scrape returns the samples of /metrics, by series as exposed
// ("name{labels}"), and the set of metric names.
func (g *gw) scrape(t *testing.T) (map[string]float64, map[string]bool) {
	t.Helper()
	code, b := g.raw(t, "", http.MethodGet, "/metrics", "")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: HTTP %d: %s", code, b)
	}
	samples := make(map[string]float64)
	names := make(map[string]bool)
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		series, val := line[:i], line[i+1:]
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		samples[series] = v
		name := series
		if j := strings.IndexByte(series, '{'); j >= 0 {
			name = series[:j]
		}
		names[name] = true
	}
	return samples, names
}

// TestAdminRoutesProcess walks every route's happy path through a real
// gateway, and a few bad requests that must change nothing.
func TestAdminRoutesProcess(t *testing.T) {
	g := startGW(t, t.TempDir(), "--limit", "5", "--window", "1h")
	if !strings.Contains(g.stderr(), `msg="admin token" path=`+filepath.Join(g.dir, admin.TokenFile)+` created=true`) {
		t.Errorf("no admin token line naming the created file:\n%s", g.stderr())
	}

	if code, b := g.raw(t, "", http.MethodGet, "/healthz", ""); code != http.StatusOK {
		t.Errorf("GET /healthz: HTTP %d %s", code, b)
	}
	if code, b := g.raw(t, "", http.MethodGet, "/api/v1/openapi.json", ""); code != http.StatusOK || !json.Valid(b) {
		t.Errorf("GET openapi.json: HTTP %d, valid JSON %v", code, json.Valid(b))
	}

	const id = "meter/1 ü" // needs escaping in a path
	c := dial5(t, g.mqtt, id)
	for i := range 2 {
		c.mustPublish(t, "devices/m", fmt.Sprint(i), codeSuccess)
	}
	m := g.mustCall(t, 200, "GET", devicePath(id), "")
	q, _ := m["quota"].(map[string]any)
	if m["device"] != id || q["limit"] != 5.0 || q["window"] != "1h0m0s" || q["policy"] != "drop" ||
		m["source"] != "default" || m["used"] != 2.0 || m["remaining"] != 3.0 || m["connected"] != true || m["last_seen"] == nil {
		t.Errorf("GET device = %v", m)
	}

	// Bad requests change nothing.
	if code, m := g.callAs(t, "wrong", "PUT", devicePath(id)+"/quota", `{"limit":1,"window":"1s"}`); code != 401 || m["error"] == "" {
		t.Errorf("wrong token: HTTP %d %v, want 401 and an error", code, m)
	}
	if code, m := g.call(t, "PUT", devicePath(id)+"/quota", `{"limit":0,"window":"1s"}`); code != 400 || !strings.Contains(fmt.Sprint(m["error"]), "limit") {
		t.Errorf("limit 0: HTTP %d %v, want 400 naming the limit", code, m)
	}
	if m := g.mustCall(t, 200, "GET", "/api/v1/quotas", ""); len(m["overrides"].([]any)) != 0 {
		t.Errorf("overrides after bad requests: %v, want none", m)
	}
	c.mustPublish(t, "devices/m", "still default", codeSuccess)

	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second).Format(time.RFC3339)
	m = g.mustCall(t, 200, "PUT", devicePath(id)+"/quota", `{"limit":10,"window":"1m","policy":"drop","expires_at":"`+exp+`"}`)
	if m["device"] != id || m["limit"] != 10.0 || m["window"] != "1m0s" || m["policy"] != "drop" || m["expires_at"] == nil {
		t.Errorf("PUT quota = %v", m)
	}
	m = g.mustCall(t, 200, "GET", devicePath(id), "")
	if m["source"] != "override" || m["override_expires_at"] == nil {
		t.Errorf("GET device after PUT = %v", m)
	}
	m = g.mustCall(t, 200, "GET", "/api/v1/quotas", "")
	if list := m["overrides"].([]any); len(list) != 1 || list[0].(map[string]any)["device"] != id {
		t.Errorf("GET quotas = %v", m)
	}

	// A refusal shows in throttled.
	g.mustCall(t, 200, "PUT", devicePath(id)+"/quota", `{"limit":3,"window":"1h"}`)
	c.mustPublish(t, "devices/m", "over", codeQuotaExceeded)
	m = g.mustCall(t, 200, "GET", "/api/v1/throttled?limit=5", "")
	if list := m["devices"].([]any); len(list) != 1 || list[0].(map[string]any)["device"] != id || list[0].(map[string]any)["refused"] != 1.0 {
		t.Errorf("GET throttled = %v", m)
	}

	m = g.mustCall(t, 200, "POST", devicePath(id)+"/reset", "")
	if m["device"] != id || m["reset"] != true {
		t.Errorf("POST reset = %v", m)
	}
	c.mustPublish(t, "devices/m", "after reset", codeSuccess)

	m = g.mustCall(t, 200, "DELETE", devicePath(id)+"/quota", "")
	if m["device"] != id || m["deleted"] != true {
		t.Errorf("DELETE quota = %v", m)
	}
	if code, m := g.call(t, "DELETE", devicePath(id)+"/quota", ""); code != 404 || m["error"] == "" {
		t.Errorf("second DELETE: HTTP %d %v, want 404", code, m)
	}
	if m := g.mustCall(t, 200, "GET", devicePath(id), ""); m["source"] != "default" {
		t.Errorf("GET device after DELETE = %v", m)
	}
	g.stop()
}

// TestOverrideJudgesNextMessageProcess: an override put while a device
// publishes judges its very next message; deleting it restores the
// default; one with an expiry lapses by itself; one survives a restart.
func TestOverrideJudgesNextMessageProcess(t *testing.T) {
	dir := t.TempDir()
	g := startGW(t, dir, "--limit", "100", "--window", "1h")
	c := dial5(t, g.mqtt, "dev-1")
	for i := range 3 {
		c.mustPublish(t, "t", fmt.Sprint(i), codeSuccess)
	}
	g.mustCall(t, 200, "PUT", devicePath("dev-1")+"/quota", `{"limit":3,"window":"1h"}`)
	c.mustPublish(t, "t", "4th", codeQuotaExceeded)
	g.mustCall(t, 200, "DELETE", devicePath("dev-1")+"/quota", "")
	c.mustPublish(t, "t", "4th again", codeSuccess) // used 4

	exp := time.Now().Add(2 * time.Second)
	g.mustCall(t, 200, "PUT", devicePath("dev-1")+"/quota", `{"limit":4,"window":"1h","expires_at":"`+exp.UTC().Format(time.RFC3339Nano)+`"}`)
	c.mustPublish(t, "t", "5th", codeQuotaExceeded)
	// Poll the device view until the override has lapsed.
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := g.mustCall(t, 200, "GET", devicePath("dev-1"), "")
		if m["source"] == "default" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("override still in force 10s after its expiry at %s: %v", exp, m)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if time.Now().Before(exp) {
		t.Fatalf("override lapsed before its expiry at %s", exp)
	}
	c.mustPublish(t, "t", "5th after expiry", codeSuccess) // used 5

	// An override survives a restart, and judges messages after it.
	g.mustCall(t, 200, "PUT", devicePath("dev-1")+"/quota", `{"limit":2,"window":"1h","policy":"drop"}`)
	c.close()
	g.stop()
	g = startGW(t, dir, "--limit", "100", "--window", "1h")
	m := g.mustCall(t, 200, "GET", devicePath("dev-1"), "")
	if q := m["quota"].(map[string]any); m["source"] != "override" || q["limit"] != 2.0 || m["used"] != 5.0 {
		t.Fatalf("after restart GET device = %v, want the override (limit 2) and used 5", m)
	}
	c = dial5(t, g.mqtt, "dev-1")
	c.mustPublish(t, "t", "after restart", codeQuotaExceeded)
	g.stop()
}

// TestQuotaCLIProcess runs `gateway quota` against a running gateway.
func TestQuotaCLIProcess(t *testing.T) {
	t.Setenv("GATEWAY_ADMIN_TOKEN", "")
	t.Setenv("GATEWAY_ADMIN_ADDR", "")
	g := startGW(t, t.TempDir(), "--limit", "100", "--window", "1h")
	cli := func(args ...string) (int, string, string) {
		t.Helper()
		return runBinary(t, append(append([]string{"quota"}, args...), "--admin-addr", g.admin, "--data-dir", g.dir)...)
	}
	mustCLI := func(args ...string) string {
		t.Helper()
		code, out, errOut := cli(args...)
		if code != 0 {
			t.Fatalf("gateway quota %v: exit %d, stderr %q", args, code, errOut)
		}
		return out
	}

	c := dial5(t, g.mqtt, "cli-dev")
	c.mustPublish(t, "t", "1", codeSuccess)

	out := mustCLI("set", "cli-dev", "--limit", "1", "--window", "30s", "--policy", "drop", "--for", "1h")
	if !strings.Contains(out, "device cli-dev: 1 messages per 30s, policy drop, until ") {
		t.Errorf("set printed %q", out)
	}
	c.mustPublish(t, "t", "2", codeQuotaExceeded)
	out = mustCLI("get", "cli-dev")
	for _, re := range []string{`(?m)^device +cli-dev$`, `(?m)^limit +1$`, `(?m)^window +30s$`, `(?m)^source +override$`, `(?m)^used +1$`, `(?m)^connected +true$`, `(?m)^override expires at +\d{4}-`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("get output lacks %s:\n%s", re, out)
		}
	}
	out = mustCLI("get", "cli-dev", "--json")
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil || m["source"] != "override" {
		t.Errorf("get --json printed %q (%v)", out, err)
	}
	out = mustCLI("list")
	if !regexp.MustCompile(`(?m)^DEVICE +LIMIT +WINDOW +POLICY +ENFORCE +EXPIRES AT +CLASSES\ncli-dev +1 +30s +drop +true +\d{4}-\S+ +-$`).MatchString(out) {
		t.Errorf("list printed:\n%s", out)
	}
	out = mustCLI("throttled", "--limit", "3")
	if !regexp.MustCompile(`(?m)^DEVICE +REFUSED\ncli-dev +1$`).MatchString(out) {
		t.Errorf("throttled printed:\n%s", out)
	}
	if out = mustCLI("reset", "cli-dev"); out != "device cli-dev: window reset\n" {
		t.Errorf("reset printed %q", out)
	}
	c.mustPublish(t, "t", "3", codeSuccess)

	// Errors: the API's message and a non-zero exit, state unchanged.
	code, _, errOut := cli("set", "cli-dev", "--limit", "0", "--window", "30s")
	if code == 0 || !strings.HasPrefix(errOut, "gateway: quota set: ") || !strings.Contains(errOut, "limit must be") || !strings.Contains(errOut, "between 1 and 1000000000 (got 0) (HTTP 400)") {
		t.Errorf("set --limit 0: exit %d, stderr %q", code, errOut)
	}
	if out = mustCLI("list", "--json"); !strings.Contains(out, `"limit": 1`) {
		t.Errorf("the override changed after a bad set: %s", out)
	}
	code, _, errOut = cli("get", "cli-dev", "--token", "wrong")
	if code == 0 || !strings.Contains(errOut, "(HTTP 401)") {
		t.Errorf("wrong token: exit %d, stderr %q", code, errOut)
	}

	if out = mustCLI("delete", "cli-dev"); !strings.Contains(out, "device cli-dev: override deleted") {
		t.Errorf("delete printed %q", out)
	}
	code, _, errOut = cli("delete", "cli-dev")
	if code == 0 || !strings.Contains(errOut, "(HTTP 404)") {
		t.Errorf("second delete: exit %d, stderr %q", code, errOut)
	}
	g.stop()
}

// TestMetricsProcess checks that the counters on /metrics equal what a
// scripted run sent, by decision, and that every metric the Grafana
// dashboard queries is exposed (forwarding to a real Mosquitto, so the
// forward metrics are there too).
func TestMetricsProcess(t *testing.T) {
	up := mosquittotest.Start(t)
	conf := filepath.Join(t.TempDir(), "gateway.yaml")
	// A rule with a group no device of the run is in: its metric series
	// exist from the start.
	yaml := "forward: [{name: cloud, to: \"mqtt://" + up.Addr + "\", topics: [\"nothing/#\"]}]\n" +
		"limits: {rules: [{name: tenants, match: {client_id: \"tenant-*\"}, group: {name: t, quota: {limit: 10, window: 1h}}}]}\n"
	if err := os.WriteFile(conf, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGW(t, t.TempDir(), "--config", conf, "--limit", "10", "--window", "1h")
	g.mustCall(t, 200, "PUT", devicePath("deferrer")+"/quota", `{"limit":1,"window":"1h","policy":"defer"}`)
	g.mustCall(t, 200, "PUT", devicePath("kicked")+"/quota", `{"limit":1,"window":"1h","policy":"disconnect"}`)

	a := dial5(t, g.mqtt, "dropper")
	for i := range 15 {
		want := byte(codeSuccess)
		if i >= 10 {
			want = codeQuotaExceeded
		}
		a.mustPublish(t, "t", fmt.Sprint(i), want)
	}
	b := dial5(t, g.mqtt, "deferrer")
	for i := range 4 {
		b.mustPublish(t, "t", fmt.Sprint(i), codeSuccess) // a deferred message is acknowledged
	}
	k := dial5(t, g.mqtt, "kicked")
	k.mustPublish(t, "t", "0", codeSuccess)
	if code, err := k.publish("t", "1"); err == nil {
		t.Fatalf("over-quota publish of policy disconnect got PUBACK 0x%02x", code)
	}
	select {
	case <-k.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("policy disconnect left the connection open")
	}

	want := map[string]float64{
		`devicegate_publishes_total{decision="allowed"}`:      12,
		`devicegate_publishes_total{decision="dropped"}`:      5,
		`devicegate_publishes_total{decision="deferred"}`:     3,
		`devicegate_publishes_total{decision="overflowed"}`:   0,
		`devicegate_publishes_total{decision="disconnected"}`: 1,
		`devicegate_deferred_queue_messages`:                  3,
		`devicegate_deferred_released_total`:                  0,
		`devicegate_devices_tracked`:                          3,
		`devicegate_connected_clients`:                        2,
		`devicegate_clock_rollbacks_total`:                    0,
	}
	// The disconnect's bookkeeping ends a little after the client sees
	// it: poll until the counts settle, then compare.
	var samples map[string]float64
	var names map[string]bool
	deadline := time.Now().Add(10 * time.Second)
	for {
		samples, names = g.scrape(t)
		diff := ""
		for series, w := range want {
			if got, ok := samples[series]; !ok || got != w {
				diff += fmt.Sprintf("\n  %s = %v (present %v), want %v", series, got, ok, w)
			}
		}
		if diff == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics differ from the run:%s", diff)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The admissions reach the disk with the next snapshot.
	for samples["devicegate_snapshots_total"] < 1 || samples["devicegate_snapshot_bytes"] <= 0 || samples["devicegate_snapshot_duration_seconds"] <= 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot in the metrics: total %v, bytes %v, seconds %v", samples["devicegate_snapshots_total"],
				samples["devicegate_snapshot_bytes"], samples["devicegate_snapshot_duration_seconds"])
		}
		time.Sleep(50 * time.Millisecond)
		samples, _ = g.scrape(t)
	}
	if samples["devicegate_deferred_queue_bytes"] <= 0 {
		t.Errorf("devicegate_deferred_queue_bytes = %v, want > 0 with 3 queued", samples["devicegate_deferred_queue_bytes"])
	}

	for _, name := range dashboardMetrics(t) {
		if !names[name] {
			t.Errorf("the dashboard queries %s, which /metrics does not expose", name)
		}
	}
	g.stop()
}

// dashboardMetrics returns every metric name in the expressions of the
// Grafana dashboard's panels.
func dashboardMetrics(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(sourceDir, "..", "..", "deploy", "grafana", "devicegate.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		SchemaVersion int `json:"schemaVersion"`
		Panels        []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	if dash.SchemaVersion < 30 || len(dash.Panels) == 0 {
		t.Fatalf("dashboard: schemaVersion %d, %d panels", dash.SchemaVersion, len(dash.Panels))
	}
	ident := regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	seen := map[string]bool{}
	var names []string
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue // a row heading queries nothing
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			found := false
			for _, id := range ident.FindAllString(tg.Expr, -1) {
				if !strings.HasPrefix(id, "devicegate_") && !strings.HasPrefix(id, "go_") && !strings.HasPrefix(id, "process_") {
					continue
				}
				found = true
				if !seen[id] {
					seen[id] = true
					names = append(names, id)
				}
			}
			if !found {
				t.Errorf("panel %q: expression %q queries no devicegate, go or process metric", p.Title, tg.Expr)
			}
		}
	}
	return names
}

// TestQuotaWindowsCLIProcess: `gateway quota set --windows` puts an
// override of several windows (a message window and a byte window)
// through a running gateway; get and list show the windows; the
// override survives a restart (stored as a version 2 override) and
// still refuses; bad --windows change nothing.
func TestQuotaWindowsCLIProcess(t *testing.T) {
	t.Setenv("GATEWAY_ADMIN_TOKEN", "")
	t.Setenv("GATEWAY_ADMIN_ADDR", "")
	dir := t.TempDir()
	g := startGW(t, dir, "--limit", "100", "--window", "1h")
	mustCLI := func(args ...string) string {
		t.Helper()
		code, out, errOut := runBinary(t, append(append([]string{"quota"}, args...), "--admin-addr", g.admin, "--data-dir", g.dir)...)
		if code != 0 {
			t.Fatalf("gateway quota %v: exit %d, stderr %q", args, code, errOut)
		}
		return out
	}
	out := mustCLI("set", "w-dev", "--windows", "2/1h,20B/1h")
	if out != "device w-dev: 2 messages per 1h0m0s, 20 bytes per 1h0m0s, policy drop\n" {
		t.Errorf("set printed %q", out)
	}
	c := dial5(t, g.mqtt, "w-dev")
	c.mustPublish(t, "t", "0123456789", codeSuccess)
	c.mustPublish(t, "t", "01234567890", codeQuotaExceeded) // 21 bytes
	c.mustPublish(t, "t", "0123456789", codeSuccess)
	c.mustPublish(t, "t", "", codeQuotaExceeded) // a third message
	out = mustCLI("get", "w-dev")
	for _, re := range []string{`(?m)^window 1 +2 messages per 1h0m0s: used 2, remaining 0, retry after `, `(?m)^window 2 +20 bytes per 1h0m0s: used 20, remaining 0`, `(?m)^source +override$`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("get output lacks %s:\n%s", re, out)
		}
	}
	if out = mustCLI("list"); !regexp.MustCompile(`(?m)^w-dev +- +2 messages per 1h0m0s, 20 bytes per 1h0m0s +drop +true +- +-$`).MatchString(out) {
		t.Errorf("list printed:\n%s", out)
	}
	for _, bad := range []struct{ windows, want string }{
		{"2/1h,20XB/1h", `"20XB" is neither a message count nor a size`},
		{"0/1h", `"0/1h": the count must be at least 1`},
		{"2000000000/1h", "windows[0].messages: must be an integer between 1 and 1000000000 (got 2000000000) (HTTP 400)"},
		{"1/1h,1/1h,1/1h,1/1h,1/1h", "windows: must hold 1 to 4 windows (got 5) (HTTP 400)"},
	} {
		code, _, errOut := runBinary(t, "quota", "set", "w-dev", "--windows", bad.windows, "--admin-addr", g.admin, "--data-dir", g.dir)
		if code == 0 || !strings.Contains(errOut, bad.want) {
			t.Errorf("--windows %s: exit %d, stderr %q, want %q", bad.windows, code, errOut, bad.want)
		}
	}
	g.stop()
	g = startGW(t, dir, "--limit", "100", "--window", "1h")
	if out = mustCLI("list"); !strings.Contains(out, "2 messages per 1h0m0s, 20 bytes per 1h0m0s") {
		t.Errorf("after the restart, list printed:\n%s", out)
	}
	c = dial5(t, g.mqtt, "w-dev")
	c.mustPublish(t, "t", "x", codeQuotaExceeded)
	g.stop()
}

// TestDataDirBeforeSeveralWindowsProcess: a data directory written with
// quotas of one window (the records an earlier release wrote, byte for
// byte: persist.TestDataFileBeforeSeveralWindows,
// TestOverrideBeforeSeveralWindows and
// broker.TestDeferredRecordBeforeSeveralWindows) starts under a
// configuration of several windows and a topic class with every window,
// override and deferred message intact: the old window is the first
// message window, still counting what it admitted.
func TestDataDirBeforeSeveralWindowsProcess(t *testing.T) {
	t.Setenv("GATEWAY_ADMIN_TOKEN", "")
	t.Setenv("GATEWAY_ADMIN_ADDR", "")
	dir := t.TempDir()
	g := startGW(t, dir, "--limit", "5", "--window", "1h")
	c := dial5(t, g.mqtt, "meter-1")
	for range 3 {
		c.mustPublish(t, "devices/meter-1/t", "x", codeSuccess)
	}
	if code, body := g.call(t, "PUT", "/api/v1/devices/meter-2/quota", `{"limit":2,"window":"1h","policy":"defer"}`); code != 200 {
		t.Fatalf("set override: %d %v", code, body)
	}
	d := dial5(t, g.mqtt, "meter-2")
	for range 3 { // the third is deferred, acked as admitted
		d.mustPublish(t, "devices/meter-2/t", "y", codeSuccess)
	}
	g.stop()

	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	yaml := `limits:
  default: {windows: [{messages: 5, window: 1h}, {bytes: 1KiB, window: 1h}]}
  classes: [{name: alarms, topics: ["devices/+/alarm"], quota: {limit: 1, window: 1h}}]
`
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	g = startGW(t, dir, "--config", cfg)
	defer g.stop()
	code, st := g.call(t, "GET", "/api/v1/devices/meter-1", "")
	ws, _ := st["quota"].(map[string]any)["windows"].([]any)
	if code != 200 || len(ws) != 2 || ws[0].(map[string]any)["used"] != 3.0 || ws[1].(map[string]any)["used"] != 0.0 {
		t.Fatalf("meter-1 after the upgrade: %d %v; want 3 messages in the old window, 0 bytes", code, st)
	}
	code, st = g.call(t, "GET", "/api/v1/devices/meter-2", "")
	q, _ := st["quota"].(map[string]any)
	if code != 200 || st["source"] != "override" || q["limit"] != 2.0 || q["policy"] != "defer" || st["used"] != 2.0 || st["deferred"] != 1.0 {
		t.Fatalf("meter-2 after the upgrade: %d %v; want its override, 2 used, 1 deferred", code, st)
	}
	c = dial5(t, g.mqtt, "meter-1")
	c.mustPublish(t, "devices/meter-1/t", "x", codeSuccess)
	c.mustPublish(t, "devices/meter-1/t", "x", codeSuccess)
	c.mustPublish(t, "devices/meter-1/t", "x", codeQuotaExceeded) // the sixth in the hour
	c.mustPublish(t, "devices/meter-1/alarm", "!", codeSuccess)   // the class's own window
}

// TestQuotaClassesCLIProcess: `gateway quota set --class` gives a
// device topic classes of its own through a running gateway: an alarm
// over its class's quota is refused naming the class while telemetry
// passes; get and list show the classes; they survive a restart (a
// version 3 override record); a bad --class changes nothing.
func TestQuotaClassesCLIProcess(t *testing.T) {
	t.Setenv("GATEWAY_ADMIN_TOKEN", "")
	t.Setenv("GATEWAY_ADMIN_ADDR", "")
	dir := t.TempDir()
	g := startGW(t, dir, "--limit", "100", "--window", "1h")
	cli := func(args ...string) (int, string, string) {
		t.Helper()
		return runBinary(t, append(append([]string{"quota"}, args...), "--admin-addr", g.admin, "--data-dir", g.dir)...)
	}
	code, out, errOut := cli("set", "c-dev", "--limit", "10", "--window", "1h",
		"--class", "alarms:1/1h:devices/c-dev/alarm", "--class", "alarms:1/1h:devices/c-dev/fire/#", "--class", "bulk:100B/1h:devices/+/bulk")
	want := "device c-dev: 10 messages per 1h0m0s, policy drop; class alarms (devices/c-dev/alarm devices/c-dev/fire/#): 1 messages per 1h0m0s, policy drop; class bulk (devices/+/bulk): 100 bytes per 1h0m0s, policy drop\n"
	if code != 0 || out != want {
		t.Fatalf("set: exit %d, out %q, stderr %q; want %q", code, out, errOut, want)
	}
	c := dial5(t, g.mqtt, "c-dev")
	c.mustPublish(t, "devices/c-dev/alarm", "!", codeSuccess)
	if code, reason := c.publishReason(t, "devices/c-dev/fire/1", "!"); code != codeQuotaExceeded || !strings.Contains(reason, "(class alarms)") {
		t.Fatalf("second alarm: 0x%02x %q; want refused by the class", code, reason)
	}
	c.mustPublish(t, "devices/c-dev/t", "telemetry", codeSuccess)
	if _, out, _ = cli("get", "c-dev"); !regexp.MustCompile(`(?m)^class alarms \(devices/c-dev/alarm devices/c-dev/fire/#\) window 1 +1 messages per 1h0m0s: used 1, remaining 0`).MatchString(out) {
		t.Errorf("get shows:\n%s", out)
	}
	if _, out, _ = cli("list"); !regexp.MustCompile(`(?m)^c-dev +10 +1h0m0s +drop +true +- +alarms,bulk$`).MatchString(out) {
		t.Errorf("list shows:\n%s", out)
	}
	for _, bad := range []struct{ class, want string }{
		{"alarms:1/1h", `"alarms:1/1h" is not NAME:WINDOWS:FILTER`},
		{"alarms:1/xx:devices/#", `class "alarms": "1/xx": "xx" is not a duration`},
		{"alarms:1/1h:devices/#/x", "classes[0].topics[0] is not a valid topic filter"},
	} {
		code, _, errOut := cli("set", "c-dev", "--limit", "5", "--window", "1h", "--class", bad.class)
		if code == 0 || !strings.Contains(errOut, bad.want) {
			t.Errorf("--class %s: exit %d, stderr %q, want %q", bad.class, code, errOut, bad.want)
		}
	}
	g.stop()
	g = startGW(t, dir, "--limit", "100", "--window", "1h")
	defer g.stop()
	if _, out, _ = cli("list"); !regexp.MustCompile(`(?m)^c-dev +10 +1h0m0s +drop +true +- +alarms,bulk$`).MatchString(out) {
		t.Errorf("after the restart, list shows:\n%s", out)
	}
	c = dial5(t, g.mqtt, "c-dev")
	if code, reason := c.publishReason(t, "devices/c-dev/alarm", "!"); code != codeQuotaExceeded || !strings.Contains(reason, "(class alarms)") {
		t.Fatalf("alarm after the restart: 0x%02x %q; want still refused by the class", code, reason)
	}
}

// TestShadowCLIProcess: `gateway quota enforce` switches a rule of a
// running gateway process between shadow mode and enforcing, from the
// device's next message; `quota rules` shows it; `quota set --shadow`
// puts an override in shadow mode, which survives a restart.
func TestShadowCLIProcess(t *testing.T) {
	t.Setenv("GATEWAY_ADMIN_TOKEN", "")
	t.Setenv("GATEWAY_ADMIN_ADDR", "")
	dir := t.TempDir()
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	// meters in shadow mode, its class alarms too, its group fleet
	// (shared with pumps) too.
	yaml := `limits:
  rules:
    - name: meters
      match: {client_id: "meter-*"}
      quota: {limit: 1, window: 1h, enforce: false}
      classes: [{name: alarms, topics: ["alarms/#"], quota: {limit: 1, window: 1h, enforce: false}}]
      group: {name: fleet, quota: {limit: 100, window: 1h, enforce: false}}
    - name: pumps
      match: {client_id: "pump-*"}
      quota: {limit: 1, window: 1h}
      group: {name: fleet, quota: {limit: 100, window: 1h, enforce: false}}
`
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGW(t, dir, "--config", cfg)
	cli := func(args ...string) (int, string, string) {
		t.Helper()
		return runBinary(t, append(append([]string{"quota"}, args...), "--admin-addr", g.admin, "--data-dir", g.dir)...)
	}
	c := dial5(t, g.mqtt, "meter-1")
	c.mustPublish(t, "devices/meter-1/t", "1", codeSuccess)
	c.mustPublish(t, "devices/meter-1/t", "2", codeSuccess) // would be refused: let through
	c.mustPublish(t, "alarms/1", "1", codeSuccess)
	c.mustPublish(t, "alarms/1", "2", codeSuccess) // the class's, let through too
	want := "rule meters: enforced until the gateway stops: its own quota and its topic classes alarms\n" +
		"group fleet: not switched, keeps its own mode (shadow mode as configured, shared with rules pumps; gateway quota set-group NAME ... [--shadow] changes one group)\n"
	if code, out, errOut := cli("enforce", "meters", "true"); code != 0 || out != want {
		t.Fatalf("enforce: exit %d, %q, %q, want %q", code, out, errOut, want)
	}
	c.mustPublish(t, "devices/meter-1/t", "3", codeQuotaExceeded)
	c.mustPublish(t, "alarms/1", "3", codeQuotaExceeded) // the class enforced with its rule
	if _, out, _ := cli("rules"); !regexp.MustCompile(`(?m)^meters +true +alarms: true +fleet: false \(not switched with the rule\)$`).MatchString(out) {
		t.Errorf("rules:\n%s", out)
	}
	if code, _, errOut := cli("enforce", "valves", "true"); code == 0 || !strings.Contains(errOut, `no rule named "valves"`) {
		t.Errorf("enforce of an unknown rule: exit %d, %q", code, errOut)
	}
	if code, _, errOut := cli("enforce", "meters", "sometimes"); code != 2 || !strings.Contains(errOut, `"sometimes" is not true or false`) {
		t.Errorf("enforce sometimes: exit %d, %q", code, errOut)
	}
	if code, out, errOut := cli("set", "meter-2", "--limit", "1", "--window", "1h", "--shadow"); code != 0 || !strings.Contains(out, ", shadow mode") {
		t.Fatalf("set --shadow: exit %d, %q, %q", code, out, errOut)
	}
	g.stop()
	g = startGW(t, dir, "--config", cfg)
	defer g.stop()
	d := dial5(t, g.mqtt, "meter-2")
	d.mustPublish(t, "devices/meter-2/t", "1", codeSuccess)
	d.mustPublish(t, "devices/meter-2/t", "2", codeSuccess) // the override, in shadow mode, survived
	if _, out, _ := cli("get", "meter-2"); !regexp.MustCompile(`(?m)^enforce +false`).MatchString(out) {
		t.Errorf("get after the restart:\n%s", out)
	}
	// The list shows the override in shadow mode.
	if _, out, _ := cli("list"); !regexp.MustCompile(`(?m)^meter-2 +1 +1h0m0s +drop +false \(shadow\) +- +-$`).MatchString(out) {
		t.Errorf("list:\n%s", out)
	}
}

// TestBlockCLIProcess: `gateway quota get` of a device never seen says
// so and shows the default quota's block; a gateway process blocks a
// device its quota refused twice within a minute; `gateway quota blocks` lists it, the
// block survives a restart (its CONNECT refused) with its start and
// reason (`blocks`, `get`), and `gateway quota unblock` lifts it.
func TestBlockCLIProcess(t *testing.T) {
	t.Setenv("GATEWAY_ADMIN_TOKEN", "")
	t.Setenv("GATEWAY_ADMIN_ADDR", "")
	dir := t.TempDir()
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(cfg, []byte("limits:\n  default: {limit: 1, window: 1h, block: {after: 2, within: 1m, for: 1h}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGW(t, dir, "--config", cfg)
	cli := func(args ...string) (int, string, string) {
		t.Helper()
		return runBinary(t, append(append([]string{"quota"}, args...), "--admin-addr", g.admin, "--data-dir", g.dir)...)
	}
	// A device never seen says so, and the table shows the quota's
	// block as --json does.
	_, out, _ := cli("get", "never-1")
	for _, re := range []string{`(?m)^last seen +never: `, `(?m)^block +after 2 refusals within 1m0s, for 1h0m0s$`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("get of a device never seen lacks %s:\n%s", re, out)
		}
	}
	c := dial5(t, g.mqtt, "flood-1")
	c.mustPublish(t, "devices/flood-1/t", "1", codeSuccess)
	if _, out, _ := cli("get", "flood-1"); regexp.MustCompile(`(?m)^last seen +never`).MatchString(out) {
		t.Errorf("get of a connected device says never seen:\n%s", out)
	}
	c.mustPublish(t, "devices/flood-1/t", "2", codeQuotaExceeded)
	_, _, _ = c.PublishReason("devices/flood-1/t", "3") // the second refusal: blocked
	select {
	case <-c.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the blocked device's connection did not end")
	}
	if _, out, _ := cli("blocks"); !regexp.MustCompile(`(?m)^flood-1 +\d{4}-`).MatchString(out) {
		t.Fatalf("blocks:\n%s", out)
	}
	if _, out, _ := cli("get", "flood-1"); !regexp.MustCompile(`(?m)^blocked until +\d{4}-\S+ \(CONNECTs refused; gateway quota unblock flood-1 lifts it\)$`).MatchString(out) {
		t.Fatalf("get of a blocked device:\n%s", out)
	}
	g.stop()
	g = startGW(t, dir, "--config", cfg)
	defer g.stop()
	if code, reason := connectCode(t, g.mqtt, "flood-1"); code != 0x8A || !strings.Contains(reason, "blocked") {
		t.Fatalf("CONNECT after the restart: 0x%02x %q; want 0x8A banned", code, reason)
	}
	// Its start and reason survived the restart too.
	why := `2 refusals over quota within 1m0s \(quota: 1 messages per 1h0m0s\)`
	if _, out, _ := cli("blocks"); !regexp.MustCompile(`(?m)^flood-1 +\d{4}-\S+ +\d{4}-\S+ +` + why + `$`).MatchString(out) {
		t.Fatalf("blocks after the restart:\n%s", out)
	}
	if _, out, _ := cli("get", "flood-1"); !regexp.MustCompile(`(?m)^block reason +`+why+`$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^blocked since +\d{4}-`).MatchString(out) {
		t.Fatalf("get after the restart:\n%s", out)
	}
	if code, out, errOut := cli("unblock", "flood-1"); code != 0 || out != "device flood-1: unblocked\n" {
		t.Fatalf("unblock: exit %d, %q, %q", code, out, errOut)
	}
	if code, _, errOut := cli("unblock", "flood-1"); code == 0 || !strings.Contains(errOut, "is not blocked") {
		t.Fatalf("second unblock: exit %d, %q", code, errOut)
	}
	// The unblock forgot the two refusals that led to the block (still
	// within the minute): blocked again only after two new ones.
	c = dial5(t, g.mqtt, "flood-1")
	c.mustPublish(t, "devices/flood-1/t", "4", codeQuotaExceeded)
	_, _, _ = c.PublishReason("devices/flood-1/t", "5")
	select {
	case <-c.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the device was not blocked again at its second new refusal")
	}
	if code, reason := connectCode(t, g.mqtt, "flood-1"); code != 0x8A {
		t.Fatalf("CONNECT after two new refusals: 0x%02x %q; want 0x8A banned", code, reason)
	}
}
