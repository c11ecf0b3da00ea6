package server

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	packets311 "github.com/eclipse/paho.mqtt.golang/packets"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/mqtttest"
)

// TestAutomaticBlocking: a device its quota refuses 3 times within a
// minute is disconnected (MQTT 5 DISCONNECT 0x98 with the reason) and
// its CONNECTs are refused (MQTT 5 CONNACK 0x8A with a reason string,
// 3.1.1 return code 5) until the block ends on the injected clock; the
// block survives a restart, is listed and lifted by the admin API, and
// counted in the metrics; another device is served all along.
func TestAutomaticBlocking(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, 1000, time.Hour)
	cfg.Admin.Token = "test-token"
	cfg.Limits.Default = config.Quota{Limit: 2, Window: config.Duration(time.Hour),
		Block: &config.Block{After: 3, Within: config.Duration(time.Minute), For: config.Duration(10 * time.Minute)}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	src := devicelimit.NewManualTime(now)
	g := mustStart(t, cfg, Deps{Time: src})
	admin := "http://" + g.AdminAddr().String()
	dev := mqtttest.Dial5(t, g.Addr().String(), "flood-1")
	dev.MustPublish(t, "devices/flood-1/t", "1", mqtttest.CodeSuccess)
	dev.MustPublish(t, "devices/flood-1/t", "2", mqtttest.CodeSuccess)
	dev.MustPublish(t, "devices/flood-1/t", "3", mqtttest.CodeQuotaExceeded)
	dev.MustPublish(t, "devices/flood-1/t", "4", mqtttest.CodeQuotaExceeded)
	// The third refusal blocks: the connection ends.
	_, _, _ = dev.PublishReason("devices/flood-1/t", "5")
	waitLost(t, dev, "the blocked device's connection did not end")
	wantRefused5(t, g.Addr().String(), "flood-1")
	wantRefused311(t, g.Addr().String(), "flood-1")
	other := mqtttest.Dial5(t, g.Addr().String(), "fine-1")
	other.MustPublish(t, "devices/fine-1/t", "ok", mqtttest.CodeSuccess)

	var blocks struct {
		Blocks []struct{ Device, Until, Since, Reason string }
	}
	if body := httpGet(t, admin+"/api/v1/blocks", "test-token"); json.Unmarshal([]byte(body), &blocks) != nil || len(blocks.Blocks) != 1 || blocks.Blocks[0].Device != "flood-1" {
		t.Fatalf("blocks: %s", body)
	}
	// The block says why, from when to when (10 minutes on the clock).
	why := "3 refusals over quota within 1m0s (quota: 2 messages per 1h0m0s)"
	b := blocks.Blocks[0]
	since, err1 := time.Parse(time.RFC3339Nano, b.Since)
	until, err2 := time.Parse(time.RFC3339Nano, b.Until)
	if b.Reason != why || err1 != nil || err2 != nil || until.Sub(since) != 10*time.Minute {
		t.Fatalf("block %+v, want the reason %q, from since to until 10m", b, why)
	}
	if m := httpGet(t, admin+"/metrics", ""); !strings.Contains(m, "devicegate_blocks_total 1\n") || !strings.Contains(m, "devicegate_devices_blocked 1\n") ||
		!strings.Contains(m, `devicegate_connects_refused_total{reason="blocked"} 2`) {
		t.Fatalf("metrics:\n%s", grepLines(m, "block"))
	}
	if body := httpGet(t, admin+"/api/v1/devices/flood-1", "test-token"); !strings.Contains(body, `"blocked_until":"`+b.Until+`","blocked_since":"`+b.Since+`","block_reason":"`+why+`"`) {
		t.Fatalf("device status lacks the block's end, start and reason: %s", body)
	}
	other.Close()
	closeGateway(t, g)

	// After a restart, still blocked; 10 minutes later, not.
	g = mustStart(t, cfg, Deps{Time: src})
	wantRefused5(t, g.Addr().String(), "flood-1")
	src.Advance(10*time.Minute + time.Second)
	waitClock(t, g, devicelimit.TickOf(now.Add(10*time.Minute+time.Second)))
	again := mqtttest.Dial5(t, g.Addr().String(), "flood-1")
	again.Close()

	// Blocked again, then lifted through the admin API.
	admin = "http://" + g.AdminAddr().String()
	c := mqtttest.Dial5(t, g.Addr().String(), "flood-2")
	for i := range 5 {
		if _, _, err := c.PublishReason("devices/flood-2/t", "x"); err != nil {
			break
		}
		_ = i
	}
	waitLost(t, c, "the second blocked device's connection did not end")
	wantRefused5(t, g.Addr().String(), "flood-2")
	httpDo(t, http.MethodDelete, admin+"/api/v1/devices/flood-2/block", "test-token", "", http.StatusOK)
	httpDo(t, http.MethodDelete, admin+"/api/v1/devices/flood-2/block", "test-token", "", http.StatusNotFound)
	// The lift forgot the refusals that led to the block: the device is
	// blocked again only after 3 new ones.
	lifted := mqtttest.Dial5(t, g.Addr().String(), "flood-2")
	lifted.MustPublish(t, "devices/flood-2/t", "a", mqtttest.CodeQuotaExceeded)
	lifted.MustPublish(t, "devices/flood-2/t", "b", mqtttest.CodeQuotaExceeded)
	_, _, _ = lifted.PublishReason("devices/flood-2/t", "c")
	waitLost(t, lifted, "the device was not blocked again at its third new refusal")
	wantRefused5(t, g.Addr().String(), "flood-2")
}

// wantRefused5 checks an MQTT 5 CONNECT of id is refused with 0x8A and a
// reason string saying when to retry.
func wantRefused5(t *testing.T, addr, id string) {
	t.Helper()
	if code, reason := mqtttest.ConnectCode(t, addr, id); code != 0x8A || !strings.Contains(reason, "retry after") {
		t.Fatalf("%s: CONNACK 0x%02x %q; want 0x8A banned with a reason string", id, code, reason)
	}
}

// wantRefused311 checks an MQTT 3.1.1 CONNECT of id is refused with
// return code 5 (not authorized).
func wantRefused311(t *testing.T, addr, id string) {
	t.Helper()
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).SetProtocolVersion(4).SetConnectRetry(false))
	tok := c.Connect()
	if !tok.WaitTimeout(10*time.Second) || tok.Error() == nil {
		c.Disconnect(0)
		t.Fatalf("%s connected over MQTT 3.1.1 while blocked", id)
	}
	if !errors.Is(tok.Error(), packets311.ErrorRefusedNotAuthorised) {
		t.Fatalf("%s over MQTT 3.1.1: %v; want not authorised (return code 5)", id, tok.Error())
	}
}

// TestBlockSharedInCluster: two gateways sharing Redis: a device
// blocked on one is refused at CONNECT by the other, and a block lifted
// on the other is lifted on both.
func TestBlockSharedInCluster(t *testing.T) {
	a, b := twoGateways(t, func(dir string) config.Config {
		c := testConfig(dir, 1000, time.Hour)
		c.Admin.Token = "test-token"
		c.Limits.Default = config.Quota{Limit: 1, Window: config.Duration(time.Hour),
			Block: &config.Block{After: 2, Within: config.Duration(time.Minute), For: config.Duration(time.Hour)}}
		return c
	})
	dev := mqtttest.Dial5(t, a.Addr().String(), "flood-1")
	dev.MustPublish(t, "devices/flood-1/t", "1", mqtttest.CodeSuccess)
	dev.MustPublish(t, "devices/flood-1/t", "2", mqtttest.CodeQuotaExceeded)
	_, _, _ = dev.PublishReason("devices/flood-1/t", "3") // blocked on A
	waitLost(t, dev, "the blocked device's connection did not end")
	wantRefused5(t, b.Addr().String(), "flood-1")
	httpDo(t, http.MethodDelete, "http://"+b.AdminAddr().String()+"/api/v1/devices/flood-1/block", "test-token", "", http.StatusOK)
	for _, g := range []*Gateway{a, b} {
		if code, reason := mqtttest.ConnectCode(t, g.Addr().String(), "flood-1"); code != 0 {
			t.Fatalf("after the lift on B, CONNECT to %s: 0x%02x %q", g.Addr(), code, reason)
		}
	}
	// The lift on B forgot the refusals counted in Redis: on A the
	// device is blocked again only at its second new refusal.
	again := mqtttest.Dial5(t, a.Addr().String(), "flood-1")
	again.MustPublish(t, "devices/flood-1/t", "4", mqtttest.CodeQuotaExceeded)
	_, _, _ = again.PublishReason("devices/flood-1/t", "5")
	waitLost(t, again, "the device was not blocked again at its second new refusal")
	wantRefused5(t, b.Addr().String(), "flood-1")
}

// waitLost waits for c's connection to end, failing with what if it
// does not.
func waitLost(t *testing.T, c *mqtttest.Client5, what string) {
	t.Helper()
	select {
	case <-c.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal(what)
	}
}

// TestClassBlockReason: a block a topic class's quota made names the
// class and its quota as its reason.
func TestClassBlockReason(t *testing.T) {
	cfg := testConfig(t.TempDir(), 1000, time.Hour)
	cfg.Admin.Token = "test-token"
	hour := config.Duration(time.Hour)
	cfg.Limits.Rules = []config.Rule{{Name: "meters", Match: config.Match{ClientID: "meter-*"}, Quota: config.Quota{Limit: 100, Window: hour},
		Classes: []config.Class{{Name: "alarms", Topics: []string{"alarms/#"},
			Quota: config.Quota{Limit: 1, Window: hour, Block: &config.Block{After: 1, Within: config.Duration(time.Minute), For: hour}}}}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := mustStart(t, cfg, Deps{})
	dev := mqtttest.Dial5(t, g.Addr().String(), "meter-1")
	dev.MustPublish(t, "alarms/1", "a", mqtttest.CodeSuccess)
	_, _, _ = dev.PublishReason("alarms/1", "a") // refused: blocked
	waitLost(t, dev, "the blocked device's connection did not end")
	want := `"reason":"1 refusals over quota within 1m0s (topic class alarms: 1 messages per 1h0m0s)"`
	if body := httpGet(t, "http://"+g.AdminAddr().String()+"/api/v1/blocks", "test-token"); !strings.Contains(body, want) {
		t.Fatalf("blocks: %s, want %s", body, want)
	}
}
