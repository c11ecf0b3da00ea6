package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/internal/mqtttest"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/logtest"
	"github.com/devicegate/devicegate/persist"
)

// In-process tests of Start, the production start-up path, with
// injected time: clock rollback, overrides across a restart, in-use and
// failed starts.

// uncleanMsg starts the warning of a start after an unclean shutdown.
const uncleanMsg = "the previous run did not shut down cleanly"

// testConfig is a valid configuration on 127.0.0.1:0 in dir, with
// limit messages per window per device.
func testConfig(dir string, limit int, window time.Duration) config.Config {
	cfg := config.Default()
	cfg.MQTT.TCP = "127.0.0.1:0"
	cfg.Admin.Addr = "127.0.0.1:0"
	cfg.DataDir = dir
	cfg.Persist.SnapshotInterval = config.Duration(100 * time.Millisecond)
	cfg.Limits.Default = config.Quota{Limit: limit, Window: config.Duration(window), Policy: devicelimit.PolicyDrop}
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	return cfg
}

// mustStart starts a gateway and closes it at the end of the test if the
// test has not.
func mustStart(t *testing.T, cfg config.Config, d Deps) *Gateway {
	t.Helper()
	g, err := Start(cfg, d)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { closeGateway(t, g) })
	return g
}

// twoGateways starts a redis-server and two gateways sharing it, each
// with its own data directory and the configuration build makes of it.
// Unless build sets cluster.redis.timeout, it is the longest allowed:
// these tests share windows through Redis, and at the default 50 ms a
// loaded machine made decisions time out into the failure policy
// (local windows), so that B admitted what A had counted
// (TestWindowsSharedInCluster failed 3 of 5 runs at load 40). Their
// cluster.decisions is redis: these tests are of the windows shared in
// Redis (owner mode, the default, has its own in cluster/ and
// cmd/gateway).
func twoGateways(t *testing.T, build func(dir string) config.Config) (a, b *Gateway) {
	t.Helper()
	srv := redistest.Start(t)
	start := func() *Gateway {
		c := build(t.TempDir())
		c.Cluster.Redis.Addrs = []string{srv.Addr}
		c.Cluster.Decisions = "redis"
		if c.Cluster.Redis.Timeout == config.Duration(config.DefaultRedisTimeout) {
			c.Cluster.Redis.Timeout = config.Duration(config.MaxRedisTimeout)
		}
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		return mustStart(t, c, Deps{})
	}
	return start(), start()
}

func closeGateway(t *testing.T, g *Gateway) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := g.Close(ctx); err != nil {
		t.Errorf("close gateway: %v", err)
	}
}

// waitClock waits until the gateway's clock reads at least tick: it
// follows the injected time source on its own 1 ms ticker.
func waitClock(t *testing.T, g *Gateway, tick devicelimit.Tick) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for g.clock.Now() < tick {
		if time.Now().After(deadline) {
			t.Fatalf("clock at %s, not %s after 10s", g.clock.Now(), tick)
		}
		time.Sleep(time.Millisecond) // polling the clock's goroutine, not letting logical time pass
	}
}

// TestStartGatewayClockRollback: a device uses its quota, the gateway
// stops, and starts again with the wall clock an hour behind. It
// continues from the persisted high-water with a warning naming both
// times; the device stays refused until a full window (plus one bucket)
// of time has passed, then is admitted again.
func TestStartGatewayClockRollback(t *testing.T) {
	const window = 2 * time.Second // 20 buckets: counted span up to 2.1 s
	dir := t.TempDir()
	cfg := testConfig(dir, 3, window)
	now := time.Now()

	src1 := devicelimit.NewManualTime(now) // stands still: every decision at now
	g1 := mustStart(t, cfg, Deps{Time: src1})
	c := mqtttest.Dial5(t, g1.Addr().String(), "meter-1")
	for i := range 3 {
		c.MustPublish(t, "devices/meter-1", fmt.Sprint("reading ", i), mqtttest.CodeSuccess)
	}
	c.MustPublish(t, "devices/meter-1", "over", mqtttest.CodeQuotaExceeded)
	closeGateway(t, g1)

	src2 := devicelimit.NewManualTime(now.Add(-time.Hour))
	logs := new(logtest.Capture)
	g2 := mustStart(t, cfg, Deps{Time: src2, Logger: slog.New(logs)})
	warn := logs.Find("wall clock is behind the persisted clock")
	if warn == nil || warn["level"] != "WARN" {
		t.Fatalf("no rollback warning; logs:\n%s", logs)
	}
	hw := devicelimit.TickOf(now)
	wall := devicelimit.TickOf(now.Add(-time.Hour))
	if warn["wall"] != wall.String() || warn["high_water"] != hw.String() {
		t.Errorf("rollback warning wall=%s high_water=%s, want %s and %s", warn["wall"], warn["high_water"], wall, hw)
	}
	for _, key := range []string{"wall", "high_water"} {
		if _, err := time.Parse(time.RFC3339Nano, warn[key]); err != nil {
			t.Errorf("%s=%q is not RFC 3339: %v", key, warn[key], err)
		}
	}
	if r := logs.Find("state restored"); r == nil || r["windows"] != "1" {
		t.Errorf("state restored = %v, want windows=1", r)
	}
	if g2.clock.Now() != hw {
		t.Fatalf("clock starts at %s, want the high-water %s", g2.clock.Now(), hw)
	}

	c2 := mqtttest.Dial5(t, g2.Addr().String(), "meter-1")
	c2.MustPublish(t, "devices/meter-1", "after rollback", mqtttest.CodeQuotaExceeded)
	if body := httpGet(t, "http://"+g2.AdminAddr().String()+"/metrics", ""); !strings.Contains(body, "\ndevicegate_clock_rollbacks_total 1\n") {
		t.Errorf("after a rollback /metrics lacks devicegate_clock_rollbacks_total 1:\n%s", body)
	}

	src2.Advance(window / 2)
	waitClock(t, g2, hw.Add(window/2))
	c2.MustPublish(t, "devices/meter-1", "half a window later", mqtttest.CodeQuotaExceeded)

	src2.Advance(window/2 + window/20 + time.Millisecond) // past T·(1+1/buckets)
	waitClock(t, g2, hw.Add(window+window/20+time.Millisecond))
	for i := range 3 {
		c2.MustPublish(t, "devices/meter-1", fmt.Sprint("next window ", i), mqtttest.CodeSuccess)
	}
	c2.MustPublish(t, "devices/meter-1", "over again", mqtttest.CodeQuotaExceeded)
}

// TestStartGatewayOverridesSurvive: an override set through the store is
// in force after a restart, and its deletion is too.
func TestStartGatewayOverridesSurvive(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, 100, time.Hour)
	g1 := mustStart(t, cfg, Deps{})
	o := devicelimit.Override{Quota: devicelimit.Quota{Limit: 1, Window: time.Hour}}
	if err := g1.store.SetOverride(g1.resolver, "meter-1", o); err != nil {
		t.Fatal(err)
	}
	if err := g1.store.SetOverride(g1.resolver, "meter-2", o); err != nil {
		t.Fatal(err)
	}
	closeGateway(t, g1)

	logs := new(logtest.Capture)
	g2 := mustStart(t, cfg, Deps{Logger: slog.New(logs)})
	if r := logs.Find("state restored"); r == nil || r["overrides"] != "2" {
		t.Errorf("state restored = %v, want overrides=2", r)
	}
	c := mqtttest.Dial5(t, g2.Addr().String(), "meter-1")
	c.MustPublish(t, "devices/meter-1", "first", mqtttest.CodeSuccess)
	c.MustPublish(t, "devices/meter-1", "second", mqtttest.CodeQuotaExceeded)
	if ok, err := g2.store.DeleteOverride(g2.resolver, "meter-2"); !ok || err != nil {
		t.Fatalf("DeleteOverride = %v, %v", ok, err)
	}
	closeGateway(t, g2)

	g3 := mustStart(t, cfg, Deps{})
	if _, ok := g3.resolver.Override("meter-2", g3.clock.Now()); ok {
		t.Errorf("deleted override for meter-2 came back")
	}
	c3 := mqtttest.Dial5(t, g3.Addr().String(), "meter-1")
	c3.MustPublish(t, "devices/meter-1", "after restart", mqtttest.CodeQuotaExceeded)
	c4 := mqtttest.Dial5(t, g3.Addr().String(), "meter-2")
	for i := range 3 {
		c4.MustPublish(t, "devices/meter-2", fmt.Sprint("default quota ", i), mqtttest.CodeSuccess)
	}
}

// TestStartGatewayInUse: a second gateway on the same directory fails
// within the lock timeout with the in-use message, and the first one is
// undisturbed.
func TestStartGatewayInUse(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, 100, time.Hour)
	g1 := mustStart(t, cfg, Deps{})
	begin := time.Now()
	g2, err := Start(cfg, Deps{})
	took := time.Since(begin)
	if err == nil {
		closeGateway(t, g2)
		t.Fatal("second gateway on the same data directory started")
	}
	want := fmt.Sprintf("data directory %q is in use by another gateway", dir)
	if !errors.Is(err, persist.ErrInUse) || !strings.HasPrefix(err.Error(), want) || took > 2*time.Second {
		t.Fatalf("second start after %s: %v; want ErrInUse within 2s, message %q", took, err, want)
	}
	mqtttest.Dial5(t, g1.Addr().String(), "meter-1").MustPublish(t, "devices/meter-1", "x", mqtttest.CodeSuccess)
}

// startAfterFailedStart starts a gateway on cfg right after a failed
// start on the same data directory: at once (the failed start let go of
// the lock) and without the warning of an unclean shutdown.
func startAfterFailedStart(t *testing.T, cfg config.Config) *Gateway {
	t.Helper()
	logs := new(logtest.Capture)
	begin := time.Now()
	g := mustStart(t, cfg, Deps{Logger: slog.New(logs)})
	if took := time.Since(begin); took > lockTimeout/2 {
		t.Errorf("start after a failed start took %s: the failed one kept the lock?", took)
	}
	if r := logs.Find(uncleanMsg); r != nil {
		t.Errorf("a failed start left the store marked unclean: %v", r)
	}
	return g
}

// TestStartGatewayFailedStartCloses: when MQTT cannot listen, start-up
// closes the store (the directory is free again at once) and the next
// start finds a clean shutdown.
func TestStartGatewayFailedStartCloses(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := t.TempDir()
	cfg := testConfig(dir, 100, time.Hour)
	busy := cfg
	busy.MQTT.TCP = l.Addr().String()
	if g, err := Start(busy, Deps{}); err == nil {
		closeGateway(t, g)
		t.Fatal("started on a port in use")
	} else if !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("err = %v, want address already in use", err)
	}
	startAfterFailedStart(t, cfg)
}

// TestStartGatewayAdminPortInUse: an admin address in use stops
// start-up with an error naming it, after MQTT started; the failed start
// stops MQTT and frees the data directory.
func TestStartGatewayAdminPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := t.TempDir()
	cfg := testConfig(dir, 100, time.Hour)
	busy := cfg
	busy.Admin.Addr = l.Addr().String()
	if g, err := Start(busy, Deps{}); err == nil {
		closeGateway(t, g)
		t.Fatal("started with the admin port in use")
	} else if msg := err.Error(); !strings.Contains(msg, "admin api") || !strings.Contains(msg, l.Addr().String()) || !strings.Contains(msg, "address already in use") {
		t.Fatalf("err = %v, want an admin api error naming %s", err, l.Addr())
	}
	g := startAfterFailedStart(t, cfg)
	if g.AdminAddr() == nil || strings.HasSuffix(g.AdminAddr().String(), ":0") {
		t.Errorf("AdminAddr() = %v, want the bound address", g.AdminAddr())
	}
}

// TestStartGatewayDataDirIsFile: a data_dir that is a file stops
// start-up with a message naming it, and leaves it alone.
func TestStartGatewayDataDirIsFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	g, err := Start(testConfig(file, 100, time.Hour), Deps{})
	if err == nil {
		closeGateway(t, g)
		t.Fatal("started with a file as data_dir")
	}
	if want := fmt.Sprintf("data directory %q is not a directory", file); !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want it to contain %q", err, want)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "x" {
		t.Fatalf("the file changed: %q, %v", b, err)
	}
}

func TestStoreError(t *testing.T) {
	dir := "/srv/gw"
	file := filepath.Join(dir, persist.FileName)
	tests := []struct {
		err      error
		sentinel error
		prefix   string
		contains []string
	}{
		{fmt.Errorf("open %q: %w", file, persist.ErrInUse), persist.ErrInUse,
			`data directory "/srv/gw" is in use by another gateway`, []string{"--data-dir"}},
		{fmt.Errorf("open %s: %w: bad magic", file, persist.ErrCorrupt), persist.ErrCorrupt,
			"open /srv/gw/devicegate.db: corrupt data file: bad magic", []string{"left as it is"}},
		{fmt.Errorf("%w: bad magic", persist.ErrCorrupt), persist.ErrCorrupt,
			"data file /srv/gw/devicegate.db: corrupt data file: bad magic", nil},
		{fmt.Errorf("%s: %w: schema 9", file, persist.ErrNewerSchema), persist.ErrNewerSchema,
			"/srv/gw/devicegate.db: data file has a newer schema: schema 9", []string{"newer devicegate"}},
		{errors.New("permission denied"), nil, "data_dir: data file /srv/gw/devicegate.db: permission denied", nil},
		{errors.New(`open store: data directory "/srv/gw" is not a directory`), nil, `data_dir: open store: data directory "/srv/gw" is not a directory`, nil},
	}
	for _, tt := range tests {
		err := storeError(dir, tt.err)
		if !strings.HasPrefix(err.Error(), tt.prefix) {
			t.Errorf("storeError(%v) = %q, want prefix %q", tt.err, err, tt.prefix)
		}
		for _, s := range tt.contains {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("storeError(%v) = %q, want it to contain %q", tt.err, err, s)
			}
		}
		if tt.sentinel != nil && !errors.Is(err, tt.sentinel) {
			t.Errorf("storeError(%v) does not wrap %v", tt.err, tt.sentinel)
		}
	}
}

// httpGet GETs url with a bearer token (if not empty) and returns the
// body, failing the test unless the status is 200.
func httpGet(t *testing.T, url, token string) string {
	t.Helper()
	return httpDo(t, http.MethodGet, url, token, "", http.StatusOK)
}

func httpDo(t *testing.T, method, url, token, body string, want int) string {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != want {
		t.Fatalf("%s %s: HTTP %d %s, want %d", method, url, resp.StatusCode, b, want)
	}
	return string(b)
}

// TestStartGatewayOverrideExpiry: an override with an expiry judges the
// device's next message while it is in force, and lapses by itself when
// the gateway's clock passes the expiry, with no request.
func TestStartGatewayOverrideExpiry(t *testing.T) {
	cfg := testConfig(t.TempDir(), 100, time.Hour)
	cfg.Admin.Token = "test-token"
	now := time.Now()
	src := devicelimit.NewManualTime(now)
	g := mustStart(t, cfg, Deps{Time: src})
	base := "http://" + g.AdminAddr().String() + "/api/v1/devices/meter-1"

	c := mqtttest.Dial5(t, g.Addr().String(), "meter-1")
	c.MustPublish(t, "devices/meter-1", "1", mqtttest.CodeSuccess)
	exp := now.Add(2 * time.Second).UTC().Format(time.RFC3339Nano)
	httpDo(t, http.MethodPut, base+"/quota", cfg.Admin.Token, `{"limit":1,"window":"1h","expires_at":"`+exp+`"}`, http.StatusOK)
	c.MustPublish(t, "devices/meter-1", "2", mqtttest.CodeQuotaExceeded)

	src.Advance(2*time.Second - time.Millisecond)
	waitClock(t, g, devicelimit.TickOf(now.Add(2*time.Second-time.Millisecond)))
	c.MustPublish(t, "devices/meter-1", "just before the expiry", mqtttest.CodeQuotaExceeded)

	src.Advance(time.Millisecond)
	waitClock(t, g, devicelimit.TickOf(now.Add(2*time.Second)))
	c.MustPublish(t, "devices/meter-1", "at the expiry", mqtttest.CodeSuccess)
	if body := httpGet(t, base, cfg.Admin.Token); !strings.Contains(body, `"source":"default"`) || !strings.Contains(body, `"used":2`) {
		t.Errorf("device after the expiry: %s", body)
	}
}

// TestFailedStartKeepsCrashWarning: after a crash, a start that fails
// (port in use) must not mark the file clean; the next start still warns
// that admissions may have been lost.
func TestFailedStartKeepsCrashWarning(t *testing.T) {
	dir := t.TempDir()
	st, err := persist.Open(dir, persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.MarkRunning(0); err != nil { // a run that then crashed
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cfg := testConfig(dir, 100, time.Hour)
	busy := cfg
	busy.MQTT.TCP = l.Addr().String()
	if g, err := Start(busy, Deps{}); err == nil {
		closeGateway(t, g)
		t.Fatal("started on a port in use")
	}
	logs := new(logtest.Capture)
	mustStart(t, cfg, Deps{Logger: slog.New(logs)})
	if logs.Find(uncleanMsg) == nil {
		t.Fatal("after a crash and a failed start, the next start did not warn of the unclean shutdown")
	}
}
