package server

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/mqtttest"
)

// TestDeferredListed: GET /api/v1/devices/{id}/deferred lists a
// device's deferred messages in the order they were deferred, its own
// queue's and a topic class's, each with its topic, class, size, QoS
// and age on the injected clock; limit gives the first N, total counts
// them all; a device without any has an empty list.
func TestDeferredListed(t *testing.T) {
	cfg := testConfig(t.TempDir(), 1, time.Hour)
	cfg.Admin.Token = "test-token"
	hour := config.Duration(time.Hour)
	cfg.Limits.Default = config.Quota{Limit: 1, Window: hour, Policy: devicelimit.PolicyDefer}
	cfg.Limits.Classes = []config.Class{{Name: "bulk", Topics: []string{"bulk/#"}, Quota: config.Quota{Limit: 1, Window: hour, Policy: devicelimit.PolicyDefer}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	src := devicelimit.NewManualTime(start)
	g := mustStart(t, cfg, Deps{Time: src})
	admin := "http://" + g.AdminAddr().String()
	dev := mqtttest.Dial5(t, g.Addr().String(), "meter-1")
	dev.MustPublish(t, "devices/meter-1/a", "admitted", mqtttest.CodeSuccess)
	dev.MustPublish(t, "devices/meter-1/b", "12345", mqtttest.CodeSuccess) // deferred
	dev.MustPublish(t, "bulk/1", "x", mqtttest.CodeSuccess)                // the class's first: admitted
	dev.MustPublish(t, "bulk/2", "123", mqtttest.CodeSuccess)              // deferred in the class
	dev.MustPublish(t, "devices/meter-1/c", "1234567", mqtttest.CodeSuccess)
	src.Advance(90 * time.Second)
	waitClock(t, g, devicelimit.TickOf(start.Add(90*time.Second)))

	type list struct {
		Device   string
		Total    int
		Messages []struct {
			Topic, Class string
			Size, QoS    int
			DeferredAt   string  `json:"deferred_at"`
			AgeSeconds   float64 `json:"age_seconds"`
		}
	}
	var got list
	body := httpGet(t, admin+"/api/v1/devices/meter-1/deferred?limit=2", "test-token")
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	if got.Device != "meter-1" || got.Total != 3 || len(got.Messages) != 2 {
		t.Fatalf("deferred list %s, want 2 of 3", body)
	}
	m0, m1 := got.Messages[0], got.Messages[1]
	if m0.Topic != "devices/meter-1/b" || m0.Class != "" || m0.Size != 5 || m0.QoS != 1 || m0.AgeSeconds < 90 || m0.AgeSeconds > 91 ||
		m1.Topic != "bulk/2" || m1.Class != "bulk" || m1.Size != 3 {
		t.Fatalf("deferred list %s: want devices/meter-1/b (5 bytes, QoS 1, 90 s old) then bulk/2 in class bulk", body)
	}
	if body := httpGet(t, admin+"/api/v1/devices/meter-1/deferred", "test-token"); json.Unmarshal([]byte(body), &got) != nil ||
		len(got.Messages) != 3 || got.Messages[2].Topic != "devices/meter-1/c" {
		t.Fatalf("deferred list without a limit %s, want all 3", body)
	}
	if body := httpGet(t, admin+"/api/v1/devices/quiet-1/deferred", "test-token"); body != `{"device":"quiet-1","total":0,"messages":[]}`+"\n" {
		t.Fatalf("a device without deferred messages: %s", body)
	}
	httpDo(t, "GET", admin+"/api/v1/devices/meter-1/deferred?limit=1001", "test-token", "", 400)
}
