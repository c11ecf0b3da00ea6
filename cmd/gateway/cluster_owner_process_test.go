package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
)

// The process tests of owner mode (cluster.decisions: owner): each
// device's publishes decided by the gateway it is connected to, real
// gateway child processes sharing one real redis-server.

// ownerConfig writes a config file of owner mode in srv, with a
// gateway TTL of 1s.
func ownerConfig(t *testing.T, srv *redistest.Server) string {
	t.Helper()
	return writeConfig(t, fmt.Sprintf("cluster:\n  redis:\n    addrs: [%q]\n    timeout: 50ms\n  failure_policy: fail-closed\n  decisions: owner\n  gateway_ttl: 1s\n", srv.Addr))
}

func startOwnerGW(t *testing.T, cfg string, args ...string) *gw {
	t.Helper()
	g := startClusterGW(t, cfg, args...)
	if !strings.Contains(g.stderr(), `msg="deciding publishes where each device is connected"`) {
		t.Fatalf("gateway does not say it decides where devices are; stderr:\n%s", g.stderr())
	}
	return g
}

// TestClusterOwnerMoveProcess: a device that used 6 of its 10 on
// gateway A connects to gateway B while its connection to A is still
// open (a half-open old connection, a clone): A closes its session
// there (one session cluster-wide, as MQTT takeover on one broker), and
// B admits exactly the 4 left, with the window moved from A exact.
func TestClusterOwnerMoveProcess(t *testing.T) {
	srv := redistest.Start(t)
	cfg := ownerConfig(t, srv)
	a := startOwnerGW(t, cfg, "--limit", "10", "--window", "1h")
	b := startOwnerGW(t, cfg, "--limit", "10", "--window", "1h")

	old := dial5(t, a.mqtt, "dev-1")
	for i := range 6 {
		old.mustPublish(t, "t", fmt.Sprint("on A ", i), codeSuccess)
	}
	moved := dial5(t, b.mqtt, "dev-1")
	select {
	case <-old.Lost():
	case <-time.After(10 * time.Second):
		t.Fatalf("the session on A survived the connection to B; A's stderr:\n%s", a.stderr())
	}
	for i := range 4 {
		moved.mustPublish(t, "t", fmt.Sprint("on B ", i), codeSuccess)
	}
	moved.mustPublish(t, "t", "11th", codeQuotaExceeded)
	if m := b.mustCall(t, 200, "GET", devicePath("dev-1"), ""); m["used"] != 10.0 || m["remaining"] != 0.0 {
		t.Fatalf("GET dev-1 on B (its owner) = %v, want used 10", m)
	}
	// A reads B's last checkpoint: behind by at most B's lease (5).
	if m := a.mustCall(t, 200, "GET", devicePath("dev-1"), ""); m["used"].(float64) < 6 || m["used"].(float64) > 10 {
		t.Fatalf("GET dev-1 on A = %v, want used between 6 and 10", m)
	}
	if !strings.Contains(a.stderr(), `msg="device taken over by another gateway; its session here closed" component=cluster device=dev-1`) {
		t.Fatalf("A does not log the takeover; stderr:\n%s", a.stderr())
	}
	// The metrics tell the move: claimed on both, released by A, held
	// by B only.
	sa, _ := a.scrape(t)
	sb, _ := b.scrape(t)
	for _, c := range []struct {
		gw     string
		metric string
		got    float64
		ok     bool
	}{
		{"A", "devicegate_cluster_owner_claims_total", sa["devicegate_cluster_owner_claims_total"], sa["devicegate_cluster_owner_claims_total"] >= 1},
		{"A", "devicegate_cluster_owner_releases_total", sa["devicegate_cluster_owner_releases_total"], sa["devicegate_cluster_owner_releases_total"] >= 1},
		{"A", "devicegate_cluster_owned_devices", sa["devicegate_cluster_owned_devices"], sa["devicegate_cluster_owned_devices"] == 0},
		{"B", "devicegate_cluster_owner_claims_total", sb["devicegate_cluster_owner_claims_total"], sb["devicegate_cluster_owner_claims_total"] >= 1},
		{"B", "devicegate_cluster_owned_devices", sb["devicegate_cluster_owned_devices"], sb["devicegate_cluster_owned_devices"] == 1},
		{"B", "devicegate_cluster_owner_fenced_total", sb["devicegate_cluster_owner_fenced_total"], sb["devicegate_cluster_owner_fenced_total"] == 0},
	} {
		if !c.ok {
			t.Errorf("%s: %s = %v", c.gw, c.metric, c.got)
		}
	}
	moved.close()
	a.stop()
	b.stop()
}

// TestClusterOwnerKillProcess: gateway A is killed with SIGKILL while
// it owns a device that admitted 8 of its 20; the device reconnects to
// B and is served again within seconds (A's liveness lapses after its
// 1s TTL), and what A's crash costs it is bounded by one lease (half
// the window): over both gateways it is admitted at least 10 and at
// most 20.
func TestClusterOwnerKillProcess(t *testing.T) {
	srv := redistest.Start(t)
	cfg := ownerConfig(t, srv)
	a := startOwnerGW(t, cfg, "--limit", "20", "--window", "1h")
	b := startOwnerGW(t, cfg, "--limit", "20", "--window", "1h")
	c := dial5(t, a.mqtt, "dev-1")
	for i := range 8 {
		c.mustPublish(t, "t", fmt.Sprint("on A ", i), codeSuccess)
	}
	a.kill()
	begin := time.Now()
	c = dial5(t, b.mqtt, "dev-1")
	admitted := 8
	for {
		code, err := c.publish("t", "on B")
		if err != nil {
			t.Fatalf("publish on B: %v", err)
		}
		if code != codeSuccess {
			break
		}
		if admitted == 8 {
			t.Logf("served again on B %v after the kill", time.Since(begin).Round(time.Millisecond))
			if took := time.Since(begin); took > 5*time.Second {
				t.Errorf("served again after %v, want within 5s", took)
			}
		}
		admitted++
		if admitted > 20 {
			t.Fatalf("%d admitted over both gateways, quota 20", admitted)
		}
	}
	if admitted < 10 {
		t.Fatalf("%d admitted over both gateways: the crash cost %d, more than one lease (10)", admitted, 20-admitted)
	}
	t.Logf("admitted %d of 20 over both gateways; the crash cost %d (bound: one lease, 10)", admitted, 20-admitted)
	b.stop()
}

// TestClusterOwnerCommandsProcess: devices that stay on their gateway
// (two gateway processes, 20 devices, 400/min each) cost Redis at most
// 0.05 commands per admitted message at steady state in owner mode, as
// Redis's own INFO commandstats counts them (commands inside scripts and
// liveness renewals included); the same load with cluster.decisions:
// redis costs at least one per message (the measurement can fail).
func TestClusterOwnerCommandsProcess(t *testing.T) {
	owner := commandsPerMessage(t, "owner")
	perMessage := commandsPerMessage(t, "redis")
	t.Logf("redis commands per admitted message: owner %.4f, redis %.4f", owner, perMessage)
	if owner > 0.05 {
		t.Fatalf("owner mode: %.4f redis commands per admitted message, want at most 0.05", owner)
	}
	if perMessage < 1 {
		t.Fatalf("per-message mode: %.4f redis commands per admitted message, want at least 1", perMessage)
	}
}

// commandsPerMessage runs the load of TestClusterOwnerCommandsProcess
// with cluster.decisions mode and returns Redis's commands per admitted
// message at steady state.
func commandsPerMessage(t *testing.T, mode string) float64 {
	t.Helper()
	srv := redistest.Start(t)
	cfg := writeConfig(t, fmt.Sprintf("cluster:\n  redis:\n    addrs: [%q]\n    timeout: 50ms\n  failure_policy: fail-closed\n  decisions: %s\n  gateway_ttl: 1s\n", srv.Addr, mode))
	gws := []*gw{startClusterGW(t, cfg, "--limit", "400", "--window", "1m"), startClusterGW(t, cfg, "--limit", "400", "--window", "1m")}
	const devices, warm, steady = 20, 5, 100
	cls := make([]*client5, devices)
	for d := range cls {
		cls[d] = dial5(t, gws[d%2].mqtt, fmt.Sprint("dev-", d))
		for i := range warm {
			cls[d].mustPublish(t, "t", fmt.Sprint("warm ", i), codeSuccess)
		}
	}
	ctx := t.Context()
	rdb := srv.Client()
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range steady {
		for _, c := range cls {
			c.mustPublish(t, "t", fmt.Sprint("steady ", i), codeSuccess)
		}
	}
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	cmds := int64(0)
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok || name == "cmdstat_info" || name == "cmdstat_config|resetstat" {
			continue
		}
		var n int64
		if _, err := fmt.Sscanf(rest, "%d", &n); err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		cmds += n
	}
	t.Logf("%s: %d redis commands for %d admitted messages\n%s", mode, cmds, devices*steady, info)
	for _, c := range cls {
		c.close()
	}
	for _, g := range gws {
		g.stop()
	}
	return float64(cmds) / float64(devices*steady)
}

// TestClusterOwnerGroupRedisClusterProcess: a tenant group on a real
// three-master Redis Cluster (refused there without owner mode), its
// devices spread over two gateway processes: the group's window, shared
// by all of them, admits exactly its 12, and each device at most its 5.
func TestClusterOwnerGroupRedisClusterProcess(t *testing.T) {
	rc := redistest.StartCluster(t, 3)
	addrs := make([]string, len(rc.Addrs()))
	for i, a := range rc.Addrs() {
		addrs[i] = fmt.Sprintf("%q", a)
	}
	cfg := writeConfig(t, fmt.Sprintf(`limits:
  rules:
    - name: tenants
      match: {client_id: "tenant-{tenant}-*"}
      quota: {limit: 5, window: 1h}
      group:
        name: "{tenant}"
        quota: {limit: 12, window: 1h}
cluster:
  redis:
    addrs: [%s]
    timeout: 500ms
  failure_policy: fail-closed
  decisions: owner
  gateway_ttl: 2s
`, strings.Join(addrs, ", ")))
	gws := []*gw{startOwnerGW(t, cfg), startOwnerGW(t, cfg)}
	admitted, byDevice := 0, map[int]int{}
	for d := range 6 {
		c := dial5(t, gws[d%2].mqtt, fmt.Sprint("tenant-acme-", d))
		for range 5 {
			code, err := c.publish("t", "m")
			if err != nil {
				t.Fatalf("publish: %v", err)
			}
			if code == codeSuccess {
				admitted++
				byDevice[d]++
			} else if code != codeQuotaExceeded {
				t.Fatalf("reason code 0x%x", code)
			}
		}
		c.close()
	}
	if admitted != 12 {
		t.Fatalf("group admitted %d over both gateways, want exactly 12 (by device %v)", admitted, byDevice)
	}
	for d, n := range byDevice {
		if n > 5 {
			t.Fatalf("device %d admitted %d, quota 5", d, n)
		}
	}
	for _, g := range gws {
		g.stop()
	}
}

// TestClusterDecisionsDisagreeProcess: a gateway deciding in Redis is
// refused at start beside one deciding where the device is (a device
// moving between them would get two windows), with an error naming
// cluster.decisions; the owner-mode gateway keeps serving, and refuses
// an override with policy defer as its configuration would.
func TestClusterDecisionsDisagreeProcess(t *testing.T) {
	srv := redistest.Start(t)
	a := startClusterGW(t, ownerConfig(t, srv), "--limit", "3", "--window", "1h")
	code, _, stderr := runBinary(t, "serve", "--config", clusterConfig(t, srv, "fail-closed"), "--data-dir", t.TempDir(),
		"--mqtt-addr", "127.0.0.1:0")
	if code != 1 || !strings.Contains(stderr, `cluster.decisions: "redis" here, but the gateways sharing this redis run with "owner"`) {
		t.Fatalf("redis-mode gateway beside an owner-mode one: exit %d, stderr:\n%s", code, stderr)
	}
	c := dial5(t, a.mqtt, "dev-1")
	c.mustPublish(t, "t", "still served", codeSuccess)
	c.close()
	// Nor can an override bring defer in at run time.
	code, _, stderr = runBinary(t, "quota", "set", "dev-1", "--limit", "5", "--window", "1m", "--policy", "defer", "--admin-addr", a.admin, "--data-dir", a.dir)
	if code != 1 || !strings.Contains(stderr, "policy: defer cannot be used with cluster.decisions: owner, the default with cluster.redis") {
		t.Errorf("quota set --policy defer in owner mode: exit %d, stderr:\n%s", code, stderr)
	}
	a.stop()
}

// TestClusterDefaultOwnerProcess: with cluster.redis and no
// cluster.decisions a gateway decides where each device is (owner mode
// is the default). Policy defer in that configuration is refused at
// start with an error naming cluster.decisions and both ways out, and
// changes nothing: no data directory, nothing written to Redis; with
// cluster.decisions: redis the same flags start.
func TestClusterDefaultOwnerProcess(t *testing.T) {
	srv := redistest.Start(t)
	plain := writeConfig(t, fmt.Sprintf("cluster:\n  redis:\n    addrs: [%q]\n    timeout: 50ms\n", srv.Addr))
	deferring := writeConfig(t, fmt.Sprintf("limits:\n  default: {limit: 3, window: 1h, policy: defer}\ncluster:\n  redis:\n    addrs: [%q]\n", srv.Addr))
	const why = "defer cannot be used with cluster.decisions: owner, the default with cluster.redis: " +
		"releasing a deferred message would take the device from the gateway it is connected to; set cluster.decisions: redis to defer, or use drop or disconnect"
	for _, tc := range []struct {
		args []string
		key  string
	}{
		{[]string{"--config", deferring}, "limits.default.policy"},
		{[]string{"--config", plain, "--limit", "3", "--window", "1h", "--policy", "defer"}, "--policy"},
	} {
		dir := filepath.Join(t.TempDir(), "data")
		code, _, stderr := runBinary(t, append([]string{"serve", "--data-dir", dir, "--mqtt-addr", "127.0.0.1:0"}, tc.args...)...)
		if code != 1 || !strings.Contains(stderr, tc.key+": "+why) {
			t.Fatalf("defer with the default decisions (%v): exit %d, stderr:\n%s\nwant %q", tc.args, code, stderr, tc.key+": "+why)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the refused start left its data directory: %v", err)
		}
		if keys, err := srv.Client().Keys(context.Background(), "*").Result(); err != nil || len(keys) != 0 {
			t.Errorf("the refused start wrote to redis: %v %v", keys, err)
		}
	}

	g := startOwnerGW(t, plain, "--limit", "3", "--window", "1h")
	c := dial5(t, g.mqtt, "dev-1")
	c.mustPublish(t, "t", "decided here", codeSuccess)
	c.close()
	g.stop()

	redisMode := writeConfig(t, fmt.Sprintf("cluster:\n  redis:\n    addrs: [%q]\n    timeout: 50ms\n  decisions: redis\n", srv.Addr))
	srv.Client().FlushAll(context.Background()) // the owner-mode gateway's settings
	d := startClusterGW(t, redisMode, "--limit", "3", "--window", "1h", "--policy", "defer")
	if strings.Contains(d.stderr(), "deciding publishes where each device is connected") {
		t.Fatalf("cluster.decisions: redis decides where devices are; stderr:\n%s", d.stderr())
	}
	d.stop()
}
