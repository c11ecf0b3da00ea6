package server

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/mqtttest"
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
	if err != nil || code != mqtttest.CodeQuotaExceeded || !strings.HasPrefix(reason, "quota exceeded: 3 messages per 1m0s, 200 bytes per 1m0s, retry after ") ||
		!strings.HasSuffix(reason, " (the 200 bytes per 1m0s window is full)") {
		t.Fatalf("60 bytes over the byte window: 0x%02x %q %v; want the reason to name the byte window", code, reason, err)
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
	if code, reason, err := dev.PublishReason("devices/meter-1/t", ""); err != nil || code != mqtttest.CodeQuotaExceeded ||
		!strings.HasSuffix(reason, " (the 3 messages per 1m0s window is full)") {
		t.Fatalf("after the restart, an empty message: 0x%02x %q %v; want refused by the message window, named", code, reason, err)
	}
	body = httpGet(t, "http://"+g.AdminAddr().String()+"/api/v1/devices/meter-1", cfg.Admin.Token)
	if err := json.Unmarshal([]byte(body), &st); err != nil || st.Quota.Windows[1].Used != 200 {
		t.Fatalf("after the restart, the byte window: %s (%v)", body, err)
	}
}

// TestTopicClasses: a rule's topic class counts a device's alarms apart
// from its telemetry: with the telemetry refused, an alarm still gets
// through, and the class's own limit refuses with a reason naming the
// class; devices of the default quota use limits.classes.
func TestTopicClasses(t *testing.T) {
	cfg := testConfig(t.TempDir(), 1000, time.Hour)
	cfg.Admin.Token = "test-token"
	minute := config.Duration(time.Minute)
	cfg.Limits.Rules = []config.Rule{{Name: "meters", Match: config.Match{ClientID: "meter-*"},
		Quota:   config.Quota{Limit: 2, Window: minute},
		Classes: []config.Class{{Name: "alarms", Topics: []string{"devices/+/alarm/#"}, Quota: config.Quota{Limit: 1, Window: minute}}}}}
	cfg.Limits.Classes = []config.Class{{Name: "status", Topics: []string{"status/#"}, Quota: config.Quota{Windows: []config.QuotaWindow{{Bytes: 10, Window: minute}}}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := mustStart(t, cfg, Deps{})
	dev := mqtttest.Dial5(t, g.Addr().String(), "meter-1")
	dev.MustPublish(t, "devices/meter-1/t", "1", mqtttest.CodeSuccess)
	dev.MustPublish(t, "devices/meter-1/t", "2", mqtttest.CodeSuccess)
	dev.MustPublish(t, "devices/meter-1/t", "3", mqtttest.CodeQuotaExceeded)
	dev.MustPublish(t, "devices/meter-1/alarm/fire", "!", mqtttest.CodeSuccess)
	code, reason, err := dev.PublishReason("devices/meter-1/alarm/smoke", "!")
	if err != nil || code != mqtttest.CodeQuotaExceeded || !strings.HasPrefix(reason, "quota exceeded (class alarms): 1 messages per 1m0s, retry after ") {
		t.Fatalf("second alarm: 0x%02x %q %v", code, reason, err)
	}
	var st struct {
		Used    int
		Classes []struct {
			Name  string
			Quota struct{ Limit, Used, Remaining int }
		}
	}
	body := httpGet(t, "http://"+g.AdminAddr().String()+"/api/v1/devices/meter-1", cfg.Admin.Token)
	if err := json.Unmarshal([]byte(body), &st); err != nil || st.Used != 2 || len(st.Classes) != 1 || st.Classes[0].Name != "alarms" ||
		st.Classes[0].Quota.Limit != 1 || st.Classes[0].Quota.Used != 1 || st.Classes[0].Quota.Remaining != 0 {
		t.Fatalf("device status %s (%v)", body, err)
	}
	// A device no rule matches: the default's classes.
	other := mqtttest.Dial5(t, g.Addr().String(), "sensor-1")
	other.MustPublish(t, "status/sensor-1", "0123456789", mqtttest.CodeSuccess)
	code, reason, err = other.PublishReason("status/sensor-1", "x")
	if err != nil || code != mqtttest.CodeQuotaExceeded || !strings.Contains(reason, "(class status): 10 bytes per 1m0s") {
		t.Fatalf("status over its bytes: 0x%02x %q %v", code, reason, err)
	}
	other.MustPublish(t, "devices/sensor-1/t", "fine", mqtttest.CodeSuccess)
	m := httpGet(t, "http://"+g.AdminAddr().String()+"/metrics", "")
	for _, want := range []string{
		`devicegate_window_refusals_total{class="",window="messages"} 1`,
		`devicegate_window_refusals_total{class="alarms",window="messages"} 1`,
		`devicegate_window_refusals_total{class="status",window="bytes"} 1`,
		`devicegate_window_refusals_total{class="status",window="too_large"} 0`,
	} {
		if !strings.Contains(m, want+"\n") {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestWindowsSharedInCluster: two gateways sharing Redis count a
// device's several windows and its topic class together: what the
// device sent through one is counted against it on the other, the
// refusal names the window, an override of several windows set on one
// is applied by the other, and the admin API of either shows the
// shared windows' state.
func TestWindowsSharedInCluster(t *testing.T) {
	hour := config.Duration(time.Hour)
	a, b := twoGateways(t, func(dir string) config.Config {
		c := testConfig(dir, 1000, time.Hour)
		c.Admin.Token = "test-token"
		c.Limits.Default = config.Quota{Windows: []config.QuotaWindow{{Messages: 3, Window: hour}, {Bytes: 100, Window: hour}}}
		c.Limits.Classes = []config.Class{{Name: "alarms", Topics: []string{"devices/+/alarm"}, Quota: config.Quota{Limit: 1, Window: hour}}}
		return c
	})
	onA := mqtttest.Dial5(t, a.Addr().String(), "meter-1")
	onA.MustPublish(t, "devices/meter-1/t", strings.Repeat("x", 60), mqtttest.CodeSuccess)
	onA.MustPublish(t, "devices/meter-1/alarm", "!", mqtttest.CodeSuccess)
	onA.Close()
	onB := mqtttest.Dial5(t, b.Addr().String(), "meter-1")
	code, reason, err := onB.PublishReason("devices/meter-1/t", strings.Repeat("x", 41))
	if err != nil || code != mqtttest.CodeQuotaExceeded || !strings.HasPrefix(reason, "quota exceeded: 3 messages per 1h0m0s, 100 bytes per 1h0m0s, retry after ") {
		t.Fatalf("41 bytes on B after 60 on A: 0x%02x %q %v; want refused by the shared byte window", code, reason, err)
	}
	onB.MustPublish(t, "devices/meter-1/t", strings.Repeat("x", 40), mqtttest.CodeSuccess)
	code, reason, err = onB.PublishReason("devices/meter-1/alarm", "!")
	if err != nil || code != mqtttest.CodeQuotaExceeded || !strings.HasPrefix(reason, "quota exceeded (class alarms): 1 messages per 1h0m0s") {
		t.Fatalf("second alarm, on B: 0x%02x %q %v", code, reason, err)
	}
	var st struct {
		Quota struct {
			Windows []struct{ Used, Remaining int }
		}
		Classes []struct{ Quota struct{ Used int } }
	}
	body := httpGet(t, "http://"+a.AdminAddr().String()+"/api/v1/devices/meter-1", "test-token")
	if err := json.Unmarshal([]byte(body), &st); err != nil || len(st.Quota.Windows) != 2 || st.Quota.Windows[0].Used != 2 ||
		st.Quota.Windows[1].Used != 100 || len(st.Classes) != 1 || st.Classes[0].Quota.Used != 1 {
		t.Fatalf("status on A of the shared windows: %s (%v)", body, err)
	}
	// An override of several windows, set on A, judges the device on B.
	ov := devicelimit.Override{Quota: devicelimit.WithWindows(devicelimit.PolicyDrop,
		devicelimit.Limit{N: 10, Window: time.Hour}, devicelimit.Limit{Unit: devicelimit.Bytes, N: 150, Window: time.Hour})}
	if err := a.SetOverride("meter-1", ov); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if q, src := b.resolver.Resolve("meter-1", "meter-1", "", b.clock.Now()); src.Kind == devicelimit.SourceOverride && q == ov.Quota {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("gateway B never learned the override of several windows set on A")
		}
		time.Sleep(10 * time.Millisecond) // polling B, not letting time pass
	}
	onB.MustPublish(t, "devices/meter-1/t", strings.Repeat("x", 50), mqtttest.CodeSuccess)
	code, reason, err = onB.PublishReason("devices/meter-1/t", "x")
	if err != nil || code != mqtttest.CodeQuotaExceeded || !strings.Contains(reason, "150 bytes per 1h0m0s") {
		t.Fatalf("over the override's byte window on B: 0x%02x %q %v", code, reason, err)
	}
	// An override with topic classes of its own (stored in Redis as v3),
	// set on A, replaces the configured class on B.
	withClasses := devicelimit.Override{Quota: devicelimit.Quota{Limit: 100, Window: time.Hour},
		Classes: []devicelimit.Class{{Name: "fire", Topics: []string{"devices/+/fire"}, Quota: devicelimit.Quota{Limit: 1, Window: time.Hour}}}}
	if err := a.SetOverride("meter-1", withClasses); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if o, ok := b.resolver.Override("meter-1", b.clock.Now()); ok && len(o.Classes) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("gateway B never learned the override with classes set on A")
		}
		time.Sleep(10 * time.Millisecond) // polling B, not letting time pass
	}
	onB.MustPublish(t, "devices/meter-1/fire", "!", mqtttest.CodeSuccess)
	code, reason, err = onB.PublishReason("devices/meter-1/fire", "!")
	if err != nil || code != mqtttest.CodeQuotaExceeded || !strings.Contains(reason, "(class fire)") {
		t.Fatalf("second fire on B: 0x%02x %q %v; want refused by the override's class", code, reason, err)
	}
	onB.MustPublish(t, "devices/meter-1/alarm", "!", mqtttest.CodeSuccess) // the configured alarms class is replaced
}

// TestTopicClassesMQTT311: the alarm class counts apart for an MQTT
// 3.1.1 device too (paho.mqtt.golang, whose PUBACK says nothing): with
// its telemetry throttled, every alarm within the class's quota reaches
// a subscriber, and none beyond it.
func TestTopicClassesMQTT311(t *testing.T) {
	cfg := testConfig(t.TempDir(), 1000, time.Hour)
	hour := config.Duration(time.Hour)
	cfg.Limits.Rules = []config.Rule{{Name: "meters", Match: config.Match{ClientID: "meter-*"},
		Quota:   config.Quota{Limit: 5, Window: hour},
		Classes: []config.Class{{Name: "alarms", Topics: []string{"devices/+/alarm/#"}, Quota: config.Quota{Limit: 3, Window: hour}}}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := mustStart(t, cfg, Deps{})
	got := make(chan string, 100)
	mqtttest.Subscribe5(t, g.Addr().String(), "backend", paho.SubscribeOptions{Topic: "devices/#", QoS: 1}, func(p *paho.Publish) { got <- p.Topic })
	dev := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + g.Addr().String()).SetClientID("meter-2").SetProtocolVersion(4))
	if tok := dev.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer dev.Disconnect(0)
	send := func(topic string) {
		if tok := dev.Publish(topic, 1, false, "x"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish %s: %v", topic, tok.Error())
		}
	}
	for range 10 { // 5 admitted, 5 refused
		send("devices/meter-2/t")
	}
	for range 4 { // 3 admitted, the fourth refused
		send("devices/meter-2/alarm/fire")
	}
	// A marker from another device, published after every PUBACK of
	// meter-2's: when it arrives, all that meter-2 got through has.
	marker := mqtttest.Dial5(t, g.Addr().String(), "meter-3")
	marker.MustPublish(t, "devices/meter-3/t", "end", mqtttest.CodeSuccess)
	counts := map[string]int{}
	for deadline := time.After(10 * time.Second); counts["devices/meter-3/t"] == 0; {
		select {
		case topic := <-got:
			counts[topic]++
		case <-deadline:
			t.Fatalf("the marker never arrived; so far %v", counts)
		}
	}
	if counts["devices/meter-2/t"] != 5 || counts["devices/meter-2/alarm/fire"] != 3 {
		t.Fatalf("arrived %v; want 5 telemetry messages and 3 alarms of meter-2", counts)
	}
}
