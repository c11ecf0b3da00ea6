package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/persist"
)

const testToken = "s3cret-test-token"

// t0 is the tests' logical start: a fixed instant.
var t0 = devicelimit.TickOf(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))

type fakeDevices struct {
	mu sync.Mutex
	m  map[string]DeviceStatus
	// refused and recent are the devices' refusal counts, latest
	// refusal and recent refusals, for Listing.
	refused map[string]DeviceSummary
	recent  map[string][]Refusal
}

func (f *fakeDevices) List() []DeviceSummary {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []DeviceSummary
	for d, st := range f.m {
		sum := f.refused[d]
		sum.Device, sum.Status = d, st
		out = append(out, sum)
	}
	return out
}

func (f *fakeDevices) Refusals(device string) []Refusal {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.recent[device]
}

func (f *fakeDevices) Status(device string) DeviceStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m[device]
}

type fakeThrottled []ThrottledDevice

func (f fakeThrottled) Top(n int) []ThrottledDevice { return f[:min(n, len(f))] }

type env struct {
	t        *testing.T
	clock    *devicelimit.ManualClock
	table    *devicelimit.Table
	resolver *devicelimit.Resolver
	store    *persist.Store
	devices  *fakeDevices
	srv      *Server
	ts       *httptest.Server
	logs     *bytes.Buffer
}

const buckets = 20

func newEnv(t *testing.T, identity devicelimit.Identity) *env {
	t.Helper()
	table, err := devicelimit.NewTable(buckets)
	if err != nil {
		t.Fatal(err)
	}
	rules := []devicelimit.Rule{
		{Name: "sensors", ClientID: "sensor-*", Quota: devicelimit.Quota{Limit: 10, Window: time.Second, Policy: devicelimit.PolicyDefer}},
		{Name: "ops", Username: "ops-*", Quota: devicelimit.Quota{Limit: 1000, Window: time.Minute}},
	}
	res, err := devicelimit.NewResolver(devicelimit.Quota{Limit: 100, Window: 10 * time.Second}, rules, buckets)
	if err != nil {
		t.Fatal(err)
	}
	st, err := persist.Open(t.TempDir(), persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &env{t: t, clock: devicelimit.NewManualClock(t0), table: table, resolver: res, store: st,
		devices: &fakeDevices{m: map[string]DeviceStatus{}}, logs: new(bytes.Buffer)}
	reg := prometheus.NewRegistry()
	e.srv, err = New(Options{
		Addr: "127.0.0.1:0", Token: testToken, Table: table, Resolver: res, Identity: identity, Clock: e.clock,
		Overrides: persist.BoundOverrides{Store: st, Resolver: res}, Devices: e.devices, Listing: e.devices,
		Throttled: fakeThrottled{{"a", 9}, {"b", 5}, {"c", 1}},
		Registry:  reg,
		Logger:    slogTo(e.logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.ts = httptest.NewServer(e.srv.Handler())
	t.Cleanup(e.ts.Close)
	return e
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("response %d not a JSON object: %v: %q", r.status, err, r.body)
	}
	return m
}

// do sends a request; path is used as given (already escaped).
func (e *env) do(method, path string, body string, hdr map[string]string) response {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.ts.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return response{resp.StatusCode, resp.Header, b}
}

// devPath escapes id as a client must: url.PathEscape, and dots escaped
// too, so that "." and ".." are not path segments a server cleans away.
func devPath(id string, suffix string) string {
	return "/api/v1/devices/" + strings.ReplaceAll(url.PathEscape(id), ".", "%2E") + suffix
}

// state is the overrides in force and those in the store.
type state struct{ live, stored []devicelimit.DeviceOverride }

func (e *env) state() state {
	e.t.Helper()
	r, err := devicelimit.NewResolver(e.resolver.Default(), nil, buckets)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.store.RestoreOverrides(r, e.clock.Now()); err != nil {
		e.t.Fatal(err)
	}
	return state{e.resolver.Overrides(e.clock.Now()), r.Overrides(e.clock.Now())}
}

func wantStatus(t *testing.T, r response, status int) map[string]any {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
	m := r.json(t)
	if status >= 400 {
		if s, _ := m["error"].(string); s == "" || len(m) != 1 {
			t.Fatalf("error body %s, want {\"error\": \"...\"}", r.body)
		}
	}
	return m
}

func TestHealthzAndMetrics(t *testing.T) {
	e := newEnv(t, devicelimit.IdentityClientID)
	m := wantStatus(t, e.do("GET", "/healthz", "", map[string]string{"Authorization": ""}), 200)
	if m["status"] != "ok" {
		t.Fatalf("healthz %v", m)
	}
	// While the data file cannot be written, /healthz says so.
	e.srv.opts.Health = func() error { return errors.New("data file d.db: writes failing: disk full") }
	r := e.do("GET", "/healthz", "", map[string]string{"Authorization": ""})
	if m := r.json(t); r.status != 503 || m["status"] != "unhealthy" || m["error"] != "data file d.db: writes failing: disk full" {
		t.Fatalf("healthz while unhealthy: %d %s", r.status, r.body)
	}
	e.srv.opts.Health = func() error { return nil }
	wantStatus(t, e.do("GET", "/healthz", "", map[string]string{"Authorization": ""}), 200)
	e.srv.opts.Registry.MustRegister(NewCollector(fixedStats{Snapshot{Allowed: 7}}))
	r = e.do("GET", "/metrics", "", map[string]string{"Authorization": ""})
	if r.status != 200 || !strings.Contains(string(r.body), `devicegate_publishes_total{decision="allowed"} 7`) {
		t.Fatalf("metrics %d: %s", r.status, r.body)
	}
}

func TestGetDevice(t *testing.T) {
	e := newEnv(t, devicelimit.IdentityClientID)
	// Default quota, no window yet.
	m := wantStatus(t, e.do("GET", devPath("dev-1", ""), "", nil), 200)
	want := map[string]any{"device": "dev-1", "quota": map[string]any{"limit": 100.0, "window": "10s", "policy": "drop"},
		"source": "default", "used": 0.0, "remaining": 100.0, "retry_after": "0s", "deferred": 0.0, "connected": false, "last_seen": nil}
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("got %v, want %v", m, want)
	}
	// A rule matched through the identity while not connected; window full.
	q := devicelimit.Quota{Limit: 10, Window: time.Second, Policy: devicelimit.PolicyDefer}
	for range 10 {
		e.table.AllowAt("sensor-7", q, e.clock.Now())
	}
	e.clock.Advance(100 * time.Millisecond)
	m = wantStatus(t, e.do("GET", devPath("sensor-7", ""), "", nil), 200)
	if m["source"] != "rule:sensors" || m["used"] != 10.0 || m["remaining"] != 0.0 || m["retry_after"] == "0s" {
		t.Fatalf("full sensor: %v", m)
	}
	if d, err := time.ParseDuration(m["retry_after"].(string)); err != nil || d <= 0 || d > time.Second || d%time.Millisecond != 0 {
		t.Fatalf("retry_after %v: %v", m["retry_after"], err)
	}
	// Connected: rules match on the live connection's client ID and username.
	e.devices.m["dev-2"] = DeviceStatus{Connected: true, ClientID: "dev-2", Username: "ops-x", LastSeen: t0, Deferred: 3}
	m = wantStatus(t, e.do("GET", devPath("dev-2", ""), "", nil), 200)
	if m["source"] != "rule:ops" || m["connected"] != true || m["deferred"] != 3.0 || m["last_seen"] != "2026-03-01T12:00:00Z" {
		t.Fatalf("connected: %v", m)
	}
	// An override with expiry wins.
	exp := t0.Add(time.Hour)
	if err := e.store.SetOverride(e.resolver, "sensor-7", devicelimit.Override{Quota: devicelimit.Quota{Limit: 5, Window: time.Minute}, ExpiresAt: exp}); err != nil {
		t.Fatal(err)
	}
	m = wantStatus(t, e.do("GET", devPath("sensor-7", ""), "", nil), 200)
	if m["source"] != "override" || m["override_expires_at"] != "2026-03-01T13:00:00Z" || m["quota"].(map[string]any)["limit"] != 5.0 {
		t.Fatalf("override: %v", m)
	}
	// Expired: back to the rule.
	e.clock.Set(exp)
	m = wantStatus(t, e.do("GET", devPath("sensor-7", ""), "", nil), 200)
	if m["source"] != "rule:sensors" || m["override_expires_at"] != nil {
		t.Fatalf("expired override: %v", m)
	}
}

func TestGetDeviceUsernameIdentity(t *testing.T) {
	e := newEnv(t, devicelimit.IdentityUsername)
	m := wantStatus(t, e.do("GET", devPath("ops-1", ""), "", nil), 200)
	if m["source"] != "rule:ops" {
		t.Fatalf("username identity: %v", m)
	}
	m = wantStatus(t, e.do("GET", devPath("sensor-1", ""), "", nil), 200)
	if m["source"] != "default" {
		t.Fatalf("username identity must not match client_id rules: %v", m)
	}
}

func TestPutGetDeleteQuota(t *testing.T) {
	e := newEnv(t, devicelimit.IdentityClientID)
	id := "plant/line 1/ü"
	m := wantStatus(t, e.do("PUT", devPath(id, "/quota"), `{"limit":5,"window":"1m","policy":"defer","expires_at":"2026-03-02T00:00:00Z"}`, nil), 200)
	want := map[string]any{"device": id, "limit": 5.0, "window": "1m0s", "policy": "defer", "expires_at": "2026-03-02T00:00:00Z"}
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("got %v, want %v", m, want)
	}
	wantOv := []devicelimit.DeviceOverride{{Device: id, Override: devicelimit.Override{
		Quota:     devicelimit.Quota{Limit: 5, Window: time.Minute, Policy: devicelimit.PolicyDefer},
		ExpiresAt: devicelimit.TickOf(time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC))}}}
	if s := e.state(); !reflect.DeepEqual(s.live, wantOv) || !reflect.DeepEqual(s.stored, wantOv) {
		t.Fatalf("state %+v, want %+v in force and stored", s, wantOv)
	}
	// Policy defaults to drop; no expiry; replaces.
	m = wantStatus(t, e.do("PUT", devPath(id, "/quota"), `{"limit":7,"window":"2s"}`, map[string]string{"Content-Type": "application/json; charset=utf-8"}), 200)
	if m["policy"] != "drop" || m["expires_at"] != nil || m["limit"] != 7.0 {
		t.Fatalf("replace: %v", m)
	}
	wantStatus(t, e.do("PUT", devPath("a", "/quota"), `{"limit":1e3,"window":"1s"}`, nil), 200)
	m = wantStatus(t, e.do("GET", "/api/v1/quotas", "", nil), 200)
	wantList := map[string]any{"overrides": []any{
		map[string]any{"device": "a", "limit": 1000.0, "window": "1s", "policy": "drop"},
		map[string]any{"device": id, "limit": 7.0, "window": "2s", "policy": "drop"},
	}}
	if !reflect.DeepEqual(m, wantList) {
		t.Fatalf("list %v, want %v", m, wantList)
	}
	m = wantStatus(t, e.do("GET", devPath(id, ""), "", nil), 200)
	if m["source"] != "override" || m["quota"].(map[string]any)["limit"] != 7.0 {
		t.Fatalf("device after put: %v", m)
	}
	m = wantStatus(t, e.do("DELETE", devPath(id, "/quota"), "", nil), 200)
	if !reflect.DeepEqual(m, map[string]any{"device": id, "deleted": true}) {
		t.Fatalf("delete: %v", m)
	}
	before := e.state()
	wantStatus(t, e.do("DELETE", devPath(id, "/quota"), "", nil), 404)
	if s := e.state(); len(s.live) != 1 || !reflect.DeepEqual(s, before) {
		t.Fatalf("state after deletes %+v", s)
	}
	wantStatus(t, e.do("DELETE", devPath("a", "/quota"), "", nil), 200)
	m = wantStatus(t, e.do("GET", "/api/v1/quotas", "", nil), 200)
	if !reflect.DeepEqual(m, map[string]any{"overrides": []any{}}) {
		t.Fatalf("empty list: %v", m)
	}
}

func TestResetAndThrottled(t *testing.T) {
	e := newEnv(t, devicelimit.IdentityClientID)
	q := e.resolver.Default()
	for range 100 {
		e.table.AllowAt("d", q, e.clock.Now())
	}
	m := wantStatus(t, e.do("POST", devPath("d", "/reset"), "", nil), 200)
	if !reflect.DeepEqual(m, map[string]any{"device": "d", "reset": true}) {
		t.Fatalf("reset: %v", m)
	}
	if d := e.table.PeekAt("d", q, e.clock.Now()); d.Count != 0 {
		t.Fatalf("window after reset: %+v", d)
	}
	m = wantStatus(t, e.do("POST", devPath("d", "/reset"), "", nil), 200)
	if m["reset"] != false {
		t.Fatalf("second reset: %v", m)
	}
	m = wantStatus(t, e.do("GET", "/api/v1/throttled", "", nil), 200)
	if len(m["devices"].([]any)) != 3 {
		t.Fatalf("throttled: %v", m)
	}
	m = wantStatus(t, e.do("GET", "/api/v1/throttled?limit=2", "", nil), 200)
	want := map[string]any{"devices": []any{map[string]any{"device": "a", "refused": 9.0}, map[string]any{"device": "b", "refused": 5.0}}}
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("got %v, want %v", m, want)
	}
	for _, bad := range []string{"0", "-1", "1001", "x", "1.5", "", "2&limit=3"} {
		wantStatus(t, e.do("GET", "/api/v1/throttled?limit="+bad, "", nil), 400)
	}
}

// An ID longer than the store's key limit (bbolt's 32768 bytes) but
// within MQTT's is a valid device: its override is stored and applied.
func TestOverrideForIDBeyondStoreKeyLimit(t *testing.T) {
	e := newEnv(t, devicelimit.IdentityClientID)
	for _, n := range []int{40000, devicelimit.MaxDeviceID} {
		id := strings.Repeat("d", n)
		wantStatus(t, e.do("PUT", devPath(id, "/quota"), `{"limit":5,"window":"10s","policy":"drop"}`, nil), 200)
		if o, ok := e.resolver.Override(id, e.clock.Now()); !ok || o.Quota.Limit != 5 {
			t.Fatalf("ID of %d bytes: override %+v, %v; want limit 5", n, o, ok)
		}
		wantStatus(t, e.do("DELETE", devPath(id, "/quota"), "", nil), 200)
		if _, ok := e.resolver.Override(id, e.clock.Now()); ok {
			t.Fatalf("ID of %d bytes: override left after DELETE", n)
		}
	}
}

func TestBadRequests(t *testing.T) {
	e := newEnv(t, devicelimit.IdentityClientID)
	if err := e.store.SetOverride(e.resolver, "dev", devicelimit.Override{Quota: devicelimit.Quota{Limit: 3, Window: time.Second}}); err != nil {
		t.Fatal(err)
	}
	e.table.AllowAt("dev", devicelimit.Quota{Limit: 3, Window: time.Second}, e.clock.Now())
	put := devPath("dev", "/quota")
	ok := `{"limit":5,"window":"10s"}`
	noAuth := map[string]string{"Authorization": ""}
	wrongAuth := map[string]string{"Authorization": "Bearer nope"}
	tests := []struct {
		name, method, path, body string
		hdr                      map[string]string
		status                   int
	}{
		{"bad json", "PUT", put, `{"limit":5,`, nil, 400},
		{"not an object", "PUT", put, `[1]`, nil, 400},
		{"empty body", "PUT", put, ``, map[string]string{"Content-Type": "application/json"}, 400},
		{"unknown field", "PUT", put, `{"limit":5,"window":"10s","burst":2}`, nil, 400},
		{"trailing data", "PUT", put, ok + `{}`, nil, 400},
		{"trailing garbage", "PUT", put, ok + ` x`, nil, 400},
		{"zero limit", "PUT", put, `{"limit":0,"window":"10s"}`, nil, 400},
		{"negative limit", "PUT", put, `{"limit":-5,"window":"10s"}`, nil, 400},
		{"huge limit", "PUT", put, `{"limit":1000000001,"window":"10s"}`, nil, 400},
		{"enormous limit", "PUT", put, `{"limit":1e300,"window":"10s"}`, nil, 400},
		{"fractional limit", "PUT", put, `{"limit":2.5,"window":"10s"}`, nil, 400},
		{"string limit", "PUT", put, `{"limit":"5","window":"10s"}`, nil, 400},
		{"missing limit", "PUT", put, `{"window":"10s"}`, nil, 400},
		{"missing window", "PUT", put, `{"limit":5}`, nil, 400},
		{"bad duration", "PUT", put, `{"limit":5,"window":"10 parsecs"}`, nil, 400},
		{"numeric window", "PUT", put, `{"limit":5,"window":10}`, nil, 400},
		{"zero window", "PUT", put, `{"limit":5,"window":"0s"}`, nil, 400},
		{"negative window", "PUT", put, `{"limit":5,"window":"-1s"}`, nil, 400},
		{"window too long", "PUT", put, `{"limit":5,"window":"721h"}`, nil, 400},
		{"buckets too narrow", "PUT", put, `{"limit":5,"window":"10ms"}`, nil, 400},
		{"bad policy", "PUT", put, `{"limit":5,"window":"10s","policy":"ignore"}`, nil, 400},
		{"expiry in the past", "PUT", put, `{"limit":5,"window":"10s","expires_at":"2026-03-01T11:59:59Z"}`, nil, 400},
		{"expiry now", "PUT", put, `{"limit":5,"window":"10s","expires_at":"2026-03-01T12:00:00Z"}`, nil, 400},
		{"expiry not RFC 3339", "PUT", put, `{"limit":5,"window":"10s","expires_at":"tomorrow"}`, nil, 400},
		{"expiry out of range", "PUT", put, `{"limit":5,"window":"10s","expires_at":"9999-01-01T00:00:00Z"}`, nil, 400},
		{"oversize body", "PUT", put, `{"limit":5,"window":"10s","policy":"` + strings.Repeat("x", 70000) + `"}`, nil, 413},
		{"wrong content type", "PUT", put, ok, map[string]string{"Content-Type": "text/plain"}, 415},
		{"missing content type", "PUT", put, ok, map[string]string{"Content-Type": ""}, 415},
		{"form content type", "PUT", put, ok, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415},
		{"invalid UTF-8 id put", "PUT", "/api/v1/devices/%FF/quota", ok, nil, 400},
		{"invalid UTF-8 id get", "GET", "/api/v1/devices/a%C3", "", nil, 400},
		{"invalid UTF-8 id delete", "DELETE", "/api/v1/devices/%FF/quota", "", nil, 400},
		{"invalid UTF-8 id reset", "POST", "/api/v1/devices/%FF/reset", "", nil, 400},
		{"id too long", "GET", devPath(strings.Repeat("d", devicelimit.MaxDeviceID+1), ""), "", nil, 400},
		{"wrong method put", "POST", put, ok, nil, 405},
		{"wrong method device", "DELETE", devPath("dev", ""), "", nil, 405},
		{"wrong method quotas", "DELETE", "/api/v1/quotas", "", nil, 405},
		{"wrong method reset", "GET", devPath("dev", "/reset"), "", nil, 405},
		{"wrong method throttled", "POST", "/api/v1/throttled", "", nil, 405},
		{"wrong method healthz", "POST", "/healthz", "", nil, 405},
		{"unknown route", "GET", "/api/v1/nothing", "", nil, 404},
		{"unknown device subroute", "GET", devPath("dev", "/window"), "", nil, 404},
		{"missing token put", "PUT", put, ok, noAuth, 401},
		{"wrong token put", "PUT", put, ok, wrongAuth, 401},
		{"basic auth put", "PUT", put, ok, map[string]string{"Authorization": "Basic " + testToken}, 401},
		{"missing token delete", "DELETE", put, "", noAuth, 401},
		{"wrong token delete", "DELETE", put, "", wrongAuth, 401},
		{"missing token reset", "POST", devPath("dev", "/reset"), "", noAuth, 401},
		{"wrong token reset", "POST", devPath("dev", "/reset"), "", wrongAuth, 401},
		{"missing token device", "GET", devPath("dev", ""), "", noAuth, 401},
		{"wrong token device", "GET", devPath("dev", ""), "", wrongAuth, 401},
		{"missing token quotas", "GET", "/api/v1/quotas", "", noAuth, 401},
		{"wrong token quotas", "GET", "/api/v1/quotas", "", wrongAuth, 401},
		{"missing token throttled", "GET", "/api/v1/throttled", "", noAuth, 401},
		{"wrong token throttled", "GET", "/api/v1/throttled", "", map[string]string{"Authorization": "Bearer " + testToken + "x"}, 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := e.state()
			window := e.table.PeekAt("dev", devicelimit.Quota{Limit: 3, Window: time.Second}, e.clock.Now())
			r := e.do(tt.method, tt.path, tt.body, tt.hdr)
			wantStatus(t, r, tt.status)
			switch tt.status {
			case 401:
				if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
					t.Fatalf("401 without WWW-Authenticate: Bearer: %v", r.header)
				}
			case 405:
				if r.header.Get("Allow") == "" {
					t.Fatalf("405 without Allow")
				}
			}
			if after := e.state(); !reflect.DeepEqual(after, before) {
				t.Fatalf("state changed: %+v, was %+v", after, before)
			}
			if got := e.table.PeekAt("dev", devicelimit.Quota{Limit: 3, Window: time.Second}, e.clock.Now()); got != window {
				t.Fatalf("window changed: %+v, was %+v", got, window)
			}
			if strings.Contains(string(r.body), testToken) {
				t.Fatalf("token in response")
			}
		})
	}
	if strings.Contains(e.logs.String(), testToken) {
		t.Fatalf("token in logs")
	}
}

// TestDeviceIDEscaping: IDs with slashes, dots and other reserved
// characters round-trip when escaped. (net/http's mux does not route a
// segment that is exactly %2F: a device named "/" cannot be addressed.)
func TestDeviceIDEscaping(t *testing.T) {
	e := newEnv(t, devicelimit.IdentityClientID)
	for _, id := range []string{"a/b", "a%2Fb", "..x", "..", ".", "a/../b", "a//b", "x/", "/x", "with space", "日本", "?q=1#f", strings.Repeat("z", 32000)} {
		m := wantStatus(t, e.do("PUT", devPath(id, "/quota"), `{"limit":2,"window":"1s"}`, nil), 200)
		if m["device"] != id {
			t.Fatalf("device %q, want %q", m["device"], id)
		}
		if _, ok := e.resolver.Override(id, e.clock.Now()); !ok {
			t.Fatalf("override for %q not in force", id)
		}
		m = wantStatus(t, e.do("GET", devPath(id, ""), "", nil), 200)
		if m["device"] != id || m["source"] != "override" {
			t.Fatalf("get %q: %v", id, m)
		}
	}
}

func TestStartClose(t *testing.T) {
	e := newEnv(t, devicelimit.IdentityClientID)
	if err := e.srv.Close(context.Background()); err != nil {
		t.Fatalf("close before start: %v", err)
	}
	if err := e.srv.Start(); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + e.srv.Addr().String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("healthz %d", resp.StatusCode)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.srv.Close(ctx); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := http.Get("http://" + e.srv.Addr().String() + "/healthz"); err == nil {
		t.Fatalf("still serving after Close")
	}
}

func TestNewRequiresOptions(t *testing.T) {
	e := newEnv(t, devicelimit.IdentityClientID)
	good := e.srv.opts
	for name, mut := range map[string]func(*Options){
		"token":     func(o *Options) { o.Token = "" },
		"table":     func(o *Options) { o.Table = nil },
		"resolver":  func(o *Options) { o.Resolver = nil },
		"clock":     func(o *Options) { o.Clock = nil },
		"overrides": func(o *Options) { o.Overrides = nil },
		"registry":  func(o *Options) { o.Registry = nil },
	} {
		o := good
		mut(&o)
		if _, err := New(o); err == nil {
			t.Errorf("New without %s: no error", name)
		}
	}
	s, err := New(Options{Token: "x", Table: good.Table, Resolver: good.Resolver, Clock: good.Clock, Overrides: good.Overrides, Registry: good.Registry})
	if err != nil {
		t.Fatal(err)
	}
	// Devices and Throttled are optional.
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	for _, path := range []string{"/api/v1/devices/x", "/api/v1/throttled"} {
		req, _ := http.NewRequest("GET", ts.URL+path, nil)
		req.Header.Set("Authorization", "Bearer x")
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s without Devices/Throttled: %d", path, resp.StatusCode)
		}
	}
}
