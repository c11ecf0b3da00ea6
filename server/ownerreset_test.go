package server

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/internal/mqtttest"
)

// TestOwnerResetOnOtherGateway: two gateways in owner mode (the default
// with cluster.redis) on a real redis-server. A device on A uses its
// whole quota; the operator's reset reaches B, which does not own the
// device. B's 200 must mean what it says: A closes the device's session
// (B took the device over), and the device, back on A, is admitted its
// whole quota again. Before, B answered 200 "reset": false and the
// device stayed refused on A.
func TestOwnerResetOnOtherGateway(t *testing.T) {
	srv := redistest.Start(t)
	start := func() *Gateway {
		c := testConfig(t.TempDir(), 3, time.Hour)
		c.Admin.Token = "test-token"
		c.Cluster.Redis.Addrs = []string{srv.Addr}
		// The longest the default gateway TTL allows (a quarter of it): a
		// decision timing out on a loaded machine would take the failure
		// policy, not the owner's windows.
		c.Cluster.Redis.Timeout = config.Duration(config.DefaultGatewayTTL / 4)
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		if c.Cluster.Decisions != "owner" {
			t.Fatalf("cluster.decisions %q, want owner by default", c.Cluster.Decisions)
		}
		return mustStart(t, c, Deps{})
	}
	a, b := start(), start()
	const dev, topic = "meter-1", "devices/meter-1"
	c := mqtttest.Dial5(t, a.Addr().String(), dev)
	for range 3 {
		c.MustPublish(t, topic, "before", mqtttest.CodeSuccess)
	}
	c.MustPublish(t, topic, "over", mqtttest.CodeQuotaExceeded)

	body := httpDo(t, http.MethodPost, "http://"+b.AdminAddr().String()+"/api/v1/devices/"+dev+"/reset", "test-token", "", http.StatusOK)
	if !strings.Contains(body, `"reset":true`) {
		t.Fatalf("reset on B answered %s, want \"reset\":true (the device had windows on A)", body)
	}
	select {
	case <-c.Lost():
	case <-time.After(10 * time.Second): // a deadline for the condition, not a wait for time to pass
		t.Fatal("A did not close the device's session after B took it over")
	}
	c2 := mqtttest.Dial5(t, a.Addr().String(), dev)
	for range 3 {
		c2.MustPublish(t, topic, "after", mqtttest.CodeSuccess)
	}
	c2.MustPublish(t, topic, "over", mqtttest.CodeQuotaExceeded)
}
