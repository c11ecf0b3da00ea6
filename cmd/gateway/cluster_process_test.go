package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
)

// The process tests of several gateways sharing their state in one real
// redis-server: real gateway child processes, real MQTT 5 clients.

// clusterConfig writes a config file sharing state in srv, every
// publish decided in Redis (cluster.decisions: redis; owner mode, the
// default, has ownerConfig).
func clusterConfig(t *testing.T, srv *redistest.Server, policy string) string {
	t.Helper()
	return writeConfig(t, fmt.Sprintf("cluster:\n  redis:\n    addrs: [%q]\n    timeout: 50ms\n  failure_policy: %s\n  decisions: redis\n", srv.Addr, policy))
}

func startClusterGW(t *testing.T, cfg string, args ...string) *gw {
	t.Helper()
	g := startGW(t, t.TempDir(), append([]string{"--config", cfg}, args...)...)
	if !strings.Contains(g.stderr(), `msg="sharing device windows and quota overrides in redis"`) {
		t.Fatalf("gateway does not say it shares its state in redis; stderr:\n%s", g.stderr())
	}
	return g
}

// TestClusterSharedWindowProcess: a device that used its quota on
// gateway A is refused on gateway B; an override set through B's admin
// API judges the device's next message on A, and A's admin API shows it.
func TestClusterSharedWindowProcess(t *testing.T) {
	srv := redistest.Start(t)
	cfg := clusterConfig(t, srv, "local")
	a := startClusterGW(t, cfg, "--limit", "3", "--window", "1h")
	b := startClusterGW(t, cfg, "--limit", "3", "--window", "1h")

	c := dial5(t, a.mqtt, "dev-1")
	for i := range 3 {
		c.mustPublish(t, "t", fmt.Sprint(i), codeSuccess)
	}
	c.mustPublish(t, "t", "4th on A", codeQuotaExceeded)
	c.close()
	c = dial5(t, b.mqtt, "dev-1") // the load balancer sends it elsewhere
	c.mustPublish(t, "t", "4th on B", codeQuotaExceeded)
	// B's admin API shows the shared window; a reset through it empties
	// the window for every gateway.
	if m := b.mustCall(t, 200, "GET", devicePath("dev-1"), ""); m["used"] != 3.0 || m["remaining"] != 0.0 {
		t.Fatalf("GET dev-1 on B = %v, want used 3, remaining 0", m)
	}
	if m := b.mustCall(t, 200, "POST", devicePath("dev-1")+"/reset", ""); m["reset"] != true {
		t.Fatalf("reset on B = %v", m)
	}
	c.close()
	c = dial5(t, a.mqtt, "dev-1")
	c.mustPublish(t, "t", "after the reset on B", codeSuccess)
	c.close()

	d := dial5(t, a.mqtt, "dev-2")
	d.mustPublish(t, "t", "1st on A", codeSuccess)
	b.mustCall(t, 200, "PUT", devicePath("dev-2")+"/quota", `{"limit":1,"window":"1h"}`)
	waitUntil(t, "the override set on B shows on A", 5*time.Second, func() bool {
		m := a.mustCall(t, 200, "GET", devicePath("dev-2"), "")
		return m["source"] == "override"
	})
	d.mustPublish(t, "t", "2nd on A, over the override", codeQuotaExceeded)
	if q := a.mustCall(t, 200, "GET", "/api/v1/quotas", ""); fmt.Sprint(q) == "" {
		t.Fatal("no quota list")
	}
	a.mustCall(t, 200, "DELETE", devicePath("dev-2")+"/quota", "")
	waitUntil(t, "the override deleted on A is gone on B", 5*time.Second, func() bool {
		m := b.mustCall(t, 200, "GET", devicePath("dev-2"), "")
		return m["source"] == "default"
	})
	d.mustPublish(t, "t", "2nd on A, default quota again", codeSuccess)
	d.close()
	a.stop()
	b.stop()
}

// TestClusterRedisKilledProcess: with failure_policy fail-closed, a
// gateway whose Redis is killed refuses (0x97) within the timeout,
// keeps serving MQTT and its admin API, counts the fallbacks, and
// decides on the shared window again once Redis is back.
func TestClusterRedisKilledProcess(t *testing.T) {
	srv := redistest.Start(t)
	g := startClusterGW(t, clusterConfig(t, srv, "fail-closed"), "--limit", "100", "--window", "1h")
	c := dial5(t, g.mqtt, "dev-1")
	c.mustPublish(t, "t", "with redis", codeSuccess)

	srv.Kill()
	for i := range 5 {
		begin := time.Now()
		c.mustPublish(t, "t", fmt.Sprint("without redis ", i), codeQuotaExceeded)
		if took := time.Since(begin); took > 500*time.Millisecond {
			t.Errorf("publish %d took %v with Redis dead (timeout 50ms)", i, took)
		}
	}
	c2 := dial5(t, g.mqtt, "dev-2") // still accepting connections
	c2.mustPublish(t, "t", "without redis", codeQuotaExceeded)
	samples, _ := g.scrape(t)
	if n := samples[`devicegate_cluster_fallbacks_total{policy="fail-closed"}`]; n < 6 {
		t.Fatalf("fallbacks %v, want >= 6; metrics: %v", n, samples)
	}
	if up := samples["devicegate_cluster_redis_up"]; up != 0 {
		t.Fatalf("redis_up %v with Redis dead", up)
	}
	g.waitLine(regexp.MustCompile(`level=WARN msg="redis unavailable; decisions follow the failure policy`), 5*time.Second)

	srv.Restart()
	waitUntil(t, "publishes admitted again after Redis came back", 10*time.Second, func() bool {
		code, err := c.publish("t", "redis back?")
		return err == nil && code == codeSuccess
	})
	samples, _ = g.scrape(t)
	if up := samples["devicegate_cluster_redis_up"]; up != 1 {
		t.Fatalf("redis_up %v after recovery", up)
	}
	g.waitLine(regexp.MustCompile(`msg="redis available again`), 5*time.Second)
	c.close()
	c2.close()
	g.stop()
}

// TestClusterStartWithoutRedisProcess: a gateway whose Redis is down at
// start-up starts all the same, says so, and applies its failure
// policy; it shares its state once Redis runs.
func TestClusterStartWithoutRedisProcess(t *testing.T) {
	srv := redistest.Start(t)
	cfg := clusterConfig(t, srv, "fail-open")
	srv.Kill()
	g := startClusterGW(t, cfg, "--limit", "1", "--window", "1h")
	if !strings.Contains(g.stderr(), "quota overrides not yet read from redis") {
		t.Fatalf("no warning about the overrides; stderr:\n%s", g.stderr())
	}
	c := dial5(t, g.mqtt, "dev-1")
	for i := range 3 { // fail-open: over the limit of 1, admitted
		c.mustPublish(t, "t", fmt.Sprint("without redis ", i), codeSuccess)
	}
	srv.Restart()
	waitUntil(t, "the shared window refuses again after Redis came up", 15*time.Second, func() bool {
		code, err := c.publish("t", "redis up?")
		return err == nil && code == codeQuotaExceeded
	})
	c.close()
	g.stop()
}

// TestClusterDeferReleaseProcess: policy defer across two gateways. A
// device fills its shared window on A, then publishes on B: B queues
// the messages (its own window would have room) and releases them only
// when the shared window admits, about T after the first message on A.
func TestClusterDeferReleaseProcess(t *testing.T) {
	srv := redistest.Start(t)
	cfg := clusterConfig(t, srv, "fail-closed")
	const window = 2 * time.Second
	args := []string{"--limit", "3", "--window", window.String(), "--policy", "defer", "--defer-restore-delay", "0s"}
	a := startClusterGW(t, cfg, args...)
	b := startClusterGW(t, cfg, args...)
	subA := subscribe5(t, a.mqtt, "backend-a", "t/#") // no bridge: consumers subscribe to every gateway
	subB := subscribe5(t, b.mqtt, "backend-b", "t/#")

	first := time.Now()
	c := dial5(t, a.mqtt, "dev-1")
	for i := range 3 {
		c.mustPublish(t, "t/1", fmt.Sprint("a", i), codeSuccess)
	}
	c.close()
	c = dial5(t, b.mqtt, "dev-1")
	for i := range 3 {
		c.mustPublish(t, "t/1", fmt.Sprint("b", i), codeSuccess) // acked once stored
	}
	waitUntil(t, "A's three messages delivered", 5*time.Second, func() bool { return len(subA.payloads()) == 3 })
	if got := subB.payloads(); len(got) != 0 {
		t.Fatalf("B forwarded %v at once: its messages should wait for the shared window", got)
	}
	waitUntil(t, "B's deferred messages released", 10*time.Second, func() bool { return len(subB.payloads()) == 3 })
	// The shared window admits again when A's bucket leaves it: no
	// earlier than T - T/buckets after the first message on A.
	if took := time.Since(first); took < window-window/20 {
		t.Fatalf("B released its messages %v after the first on A, before the window of %v had passed", took, window)
	}
	if got := subB.payloads(); fmt.Sprint(got) != "[b0 b1 b2]" {
		t.Fatalf("B delivered %v, want b0 b1 b2 in order", got)
	}
	c.close()
	a.stop()
	b.stop()
}

// TestSimulateEmbeddedMixSharedInCluster: the embedded simulator's quota
// mix goes through the admin API's path: with a cluster configuration
// the overrides it sets land in Redis, and a second gateway (a process
// of its own) sharing that Redis shows them. They used to stay in the
// embedded gateway's own data file.
func TestSimulateEmbeddedMixSharedInCluster(t *testing.T) {
	srv := redistest.Start(t)
	cfg := clusterConfig(t, srv, "local")
	b := startClusterGW(t, cfg, "--limit", "100", "--window", "1h")
	code, stdout, stderr := runBinary(t, "simulate", "--embedded", "--config", cfg, "--devices", "2", "--rate", "5/s",
		"--duration", "500ms", "--limit", "100", "--window", "1h", "--mix", "50%:100/1h,50%:3/1h")
	if code != 0 {
		t.Fatalf("simulate: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	overridden := 0
	for _, dev := range []string{"dev-00000", "dev-00001"} {
		m := b.mustCall(t, 200, "GET", devicePath(dev), "")
		if m["source"] == "override" {
			if q, _ := m["quota"].(map[string]any); q["limit"] != 3.0 {
				t.Fatalf("GET %s on the second gateway = %v, want the mix's 3/1h", dev, m)
			}
			overridden++
		}
	}
	if overridden != 1 {
		t.Fatalf("%d of 2 devices have the mix's override on the second gateway, want 1", overridden)
	}
}
