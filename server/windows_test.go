package server

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"devicegate/config"
	"devicegate/internal/mqtttest"
)

// TestSeveralWindows: a gateway whose default quota is 3 messages and
// 200 bytes per minute admits an MQTT 5 device's messages while both
// windows have room, refuses (0x97) the one that would pass the bytes,
// saying the quota and when to retry, and refuses one larger than the
// byte window as never admitted; the admin API shows each window's
// state; a restart keeps both windows (the byte window under its own
// key in the data file).
func TestSeveralWindows(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, 1000, time.Hour)
	cfg.Admin.Token = "test-token"
	cfg.Limits.Default = config.Quota{Windows: []config.QuotaWindow{
		{Messages: 3, Window: config.Duration(time.Minute)},
		{Bytes: 200, Window: config.Duration(time.Minute)},
	}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	payload := func(n int) string { return strings.Repeat("x", n) }
	g := mustStart(t, cfg, Deps{})
	dev := mqtttest.Dial5(t, g.Addr().String(), "meter-1")
	dev.MustPublish(t, "devices/meter-1/t", payload(100), mqtttest.CodeSuccess)
	dev.MustPublish(t, "devices/meter-1/t", payload(50), mqtttest.CodeSuccess)
	code, reason, err := dev.PublishReason("devices/meter-1/t", payload(60))
	if err != nil || code != mqtttest.CodeQuotaExceeded || !strings.HasPrefix(reason, "quota exceeded: 3 messages per 1m0s, 200 bytes per 1m0s, retry after ") {
		t.Fatalf("60 bytes over the byte window: 0x%02x %q %v", code, reason, err)
	}
	code, reason, err = dev.PublishReason("devices/meter-1/t", payload(201))
	if err != nil || code != mqtttest.CodeQuotaExceeded || !strings.Contains(reason, "201 bytes never fit a window of 200: not retried") {
		t.Fatalf("201 bytes: 0x%02x %q %v", code, reason, err)
	}
	dev.MustPublish(t, "devices/meter-1/t", payload(50), mqtttest.CodeSuccess)
	// The message window is full now, the byte window at 200.
	var st struct {
		Quota struct {
			Windows []struct {
				Messages, Bytes, Used, Remaining int
				Window                           string
			}
		}
		Used, Remaining int
	}
	body := httpGet(t, "http://"+g.AdminAddr().String()+"/api/v1/devices/meter-1", cfg.Admin.Token)
	if err := json.Unmarshal([]byte(body), &st); err != nil || len(st.Quota.Windows) != 2 ||
		st.Quota.Windows[0].Messages != 3 || st.Quota.Windows[0].Used != 3 || st.Quota.Windows[1].Bytes != 200 || st.Quota.Windows[1].Used != 200 {
		t.Fatalf("device status %s (%v)", body, err)
	}
	dev.Close()
	closeGateway(t, g)

	g = mustStart(t, cfg, Deps{})
	dev = mqtttest.Dial5(t, g.Addr().String(), "meter-1")
	if code, reason, err := dev.PublishReason("devices/meter-1/t", ""); err != nil || code != mqtttest.CodeQuotaExceeded {
		t.Fatalf("after the restart, an empty message: 0x%02x %q %v; want refused by the message window", code, reason, err)
	}
	body = httpGet(t, "http://"+g.AdminAddr().String()+"/api/v1/devices/meter-1", cfg.Admin.Token)
	if err := json.Unmarshal([]byte(body), &st); err != nil || st.Quota.Windows[1].Used != 200 {
		t.Fatalf("after the restart, the byte window: %s (%v)", body, err)
	}
}
