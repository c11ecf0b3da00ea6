package server

import (
	"testing"
	"time"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/mqtttest"
)

// TestSetOverrideSharedInCluster: an override set in-process (the
// embedded simulator's --mix, for one) takes the admin API's path: in
// cluster mode it goes to Redis, so a second gateway sharing the Redis
// judges the device by it. It used to go to the first gateway's own
// data file only.
func TestSetOverrideSharedInCluster(t *testing.T) {
	a, b := twoGateways(t, func(dir string) config.Config { return testConfig(dir, 100, time.Hour) })
	if err := a.SetOverride("dev-1", devicelimit.Override{Quota: devicelimit.Quota{Limit: 2, Window: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if q, src := b.resolver.Resolve("dev-1", "dev-1", "", b.clock.Now()); src.Kind == devicelimit.SourceOverride && q.Limit == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("gateway B never learned the override set on A")
		}
		time.Sleep(10 * time.Millisecond) // polling B, not letting time pass
	}
	c := mqtttest.Dial5(t, b.Addr().String(), "dev-1")
	c.MustPublish(t, "t", "1", mqtttest.CodeSuccess)
	c.MustPublish(t, "t", "2", mqtttest.CodeSuccess)
	c.MustPublish(t, "t", "3", mqtttest.CodeQuotaExceeded)
}
