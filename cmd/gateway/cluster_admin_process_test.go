package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
)

// TestClusterAdminStatusWithoutRedisProcess: while Redis does not
// answer, GET /api/v1/devices/{id} cannot show the shared window: it
// answers 503, as reset does, instead of numbers made up by the failure
// policy (fail-closed: every device "used" to its limit), and a look is
// not a decision: it counts no fallback. It shows the window again once
// Redis is back.
func TestClusterAdminStatusWithoutRedisProcess(t *testing.T) {
	srv := redistest.Start(t)
	g := startClusterGW(t, clusterConfig(t, srv, "fail-closed"), "--limit", "100", "--window", "1h")
	c := dial5(t, g.mqtt, "dev-1")
	c.mustPublish(t, "t", "with redis", codeSuccess)
	c.close()
	if m := g.mustCall(t, 200, "GET", devicePath("dev-1"), ""); m["used"] != 1.0 {
		t.Fatalf("GET dev-1 with Redis = %v, want used 1", m)
	}

	srv.Kill()
	code, m := g.call(t, "GET", devicePath("dev-1"), "")
	if code != 503 || !strings.Contains(fmt.Sprint(m["error"]), "unavailable") {
		t.Fatalf("GET dev-1 with Redis dead: HTTP %d %v, want 503, unavailable", code, m)
	}
	samples, _ := g.scrape(t)
	if n := samples[`devicegate_cluster_fallbacks_total{policy="fail-closed"}`]; n != 0 {
		t.Fatalf("fallbacks %v after an admin look, want 0", n)
	}

	srv.Restart() // empty: the window was in the killed server
	waitUntil(t, "the device's window shown again", 10*time.Second, func() bool {
		code, m := g.call(t, "GET", devicePath("dev-1"), "")
		return code == 200 && m["used"] == 0.0
	})
	g.stop()
}
