package server

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/internal/mqtttest"
)

// TestShadowModeSwitchedAtRuntime: a rule with enforce: false lets its
// devices' messages over quota through, counting them as would-refuse
// (metric, device status), and a log line says "would throttle"; the
// admin API switches the rule to enforcing, which refuses the very next
// message, and back; an override in shadow mode lets a device through
// whatever its rule says.
func TestShadowModeSwitchedAtRuntime(t *testing.T) {
	cfg := testConfig(t.TempDir(), 1000, time.Hour)
	cfg.Admin.Token = "test-token"
	off := false
	cfg.Limits.Rules = []config.Rule{{Name: "meters", Match: config.Match{ClientID: "meter-*"},
		Quota: config.Quota{Limit: 2, Window: config.Duration(time.Hour), Enforce: &off}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := mustStart(t, cfg, Deps{})
	admin := "http://" + g.AdminAddr().String()
	dev := mqtttest.Dial5(t, g.Addr().String(), "meter-1")
	for range 5 { // 2 within the quota, 3 it would refuse
		dev.MustPublish(t, "devices/meter-1/t", "x", mqtttest.CodeSuccess)
	}
	if m := httpGet(t, admin+"/metrics", ""); !strings.Contains(m, "devicegate_publishes_would_refuse_total 3\n") {
		t.Fatalf("metrics lack 3 would-refuse:\n%s", grepLines(m, "would_refuse"))
	}
	var st struct {
		Quota struct {
			Enforce *bool
			Limit   int
		}
		Used int
	}
	if body := httpGet(t, admin+"/api/v1/devices/meter-1", "test-token"); json.Unmarshal([]byte(body), &st) != nil ||
		st.Quota.Enforce == nil || *st.Quota.Enforce || st.Used != 2 {
		t.Fatalf("device status %s: want enforce false and 2 used (as an enforcing quota would count)", body)
	}
	httpDo(t, "PUT", admin+"/api/v1/rules/meters/enforce", "test-token", `{"enforce":true}`, 200)
	dev.MustPublish(t, "devices/meter-1/t", "x", mqtttest.CodeQuotaExceeded) // the next message
	if body := httpGet(t, admin+"/api/v1/rules", "test-token"); body != `{"rules":[{"rule":"meters","enforce":true,"would_refuse":3}]}`+"\n" {
		t.Fatalf("rules: %s", body)
	}
	httpDo(t, "PUT", admin+"/api/v1/rules/meters/enforce", "test-token", `{"enforce":false}`, 200)
	dev.MustPublish(t, "devices/meter-1/t", "x", mqtttest.CodeSuccess)
	httpDo(t, "PUT", admin+"/api/v1/rules/pumps/enforce", "test-token", `{"enforce":true}`, 404)
	httpDo(t, "PUT", admin+"/api/v1/rules/meters/enforce", "test-token", `{"enforce":"yes"}`, 400)
	if body := httpGet(t, admin+"/api/v1/rules", "test-token"); !strings.Contains(body, `"enforce":false`) {
		t.Fatalf("a refused switch changed the rule: %s", body)
	}

	// An override in shadow mode: enforced rule, device let through.
	httpDo(t, "PUT", admin+"/api/v1/rules/meters/enforce", "test-token", `{"enforce":true}`, 200)
	httpDo(t, "PUT", admin+"/api/v1/devices/meter-2/quota", "test-token", `{"limit":1,"window":"1h","enforce":false}`, 200)
	other := mqtttest.Dial5(t, g.Addr().String(), "meter-2")
	other.MustPublish(t, "devices/meter-2/t", "x", mqtttest.CodeSuccess)
	other.MustPublish(t, "devices/meter-2/t", "x", mqtttest.CodeSuccess)
	if m := httpGet(t, admin+"/metrics", ""); !strings.Contains(m, "devicegate_publishes_would_refuse_total 5\n") {
		t.Fatalf("metrics after the override:\n%s", grepLines(m, "would_refuse"))
	}
	// Counted under the rule meter-2 matches, whose quota it overrides.
	if body := httpGet(t, admin+"/api/v1/rules", "test-token"); !strings.Contains(body, `"would_refuse":5`) {
		t.Fatalf("rules after the override: %s, want meters would refuse 5", body)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestRuleSwitchCoversClasses: switching a rule switches its topic
// classes with its own quota, from the next message of a device
// connected before the switch, and leaves its group (shared with
// another rule) in its own mode; the answer says so; the device's
// status shows the class in the rule's mode.
func TestRuleSwitchCoversClasses(t *testing.T) {
	cfg := testConfig(t.TempDir(), 1000, time.Hour)
	cfg.Admin.Token = "test-token"
	off, hour := false, config.Duration(time.Hour)
	fleet := &config.Group{Name: "fleet", Quota: config.Quota{Limit: 100, Window: hour, Enforce: &off}}
	cfg.Limits.Rules = []config.Rule{
		{Name: "meters", Match: config.Match{ClientID: "meter-*"}, Quota: config.Quota{Limit: 1, Window: hour, Enforce: &off},
			Classes: []config.Class{{Name: "alarms", Topics: []string{"alarms/#"}, Quota: config.Quota{Limit: 1, Window: hour, Enforce: &off}}},
			Group:   fleet},
		{Name: "pumps", Match: config.Match{ClientID: "pump-*"}, Quota: config.Quota{Limit: 1, Window: hour}, Group: fleet},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := mustStart(t, cfg, Deps{})
	admin := "http://" + g.AdminAddr().String()
	dev := mqtttest.Dial5(t, g.Addr().String(), "meter-1")
	for range 2 {
		dev.MustPublish(t, "alarms/1", "a", mqtttest.CodeSuccess) // the second one would be refused: shadow
	}
	got := httpDo(t, "PUT", admin+"/api/v1/rules/meters/enforce", "test-token", `{"enforce":true}`, 200)
	want := `{"rule":"meters","enforce":true,"classes":[{"name":"alarms","enforce":true}],` +
		`"group":{"name":"fleet","enforce":false,"switched":false,"shared_with":["pumps"]},"switched":["quota","class alarms"]}` + "\n"
	if got != want {
		t.Fatalf("switch answer:\n%s\nwant\n%s", got, want)
	}
	dev.MustPublish(t, "alarms/1", "a", mqtttest.CodeQuotaExceeded) // judged by the class, enforced now
	var st struct {
		Classes []struct {
			Name  string
			Quota struct{ Enforce *bool }
		}
	}
	if body := httpGet(t, admin+"/api/v1/devices/meter-1", "test-token"); json.Unmarshal([]byte(body), &st) != nil ||
		len(st.Classes) != 1 || st.Classes[0].Quota.Enforce != nil {
		t.Fatalf("device status after the switch: %s, want the class alarms enforced (no enforce: false)", body)
	}
	// The group stayed in shadow mode: a group at its cap would let
	// through; its mode is unchanged in the list.
	if body := httpGet(t, admin+"/api/v1/rules", "test-token"); !strings.Contains(body, `{"rule":"pumps","enforce":true,"would_refuse":0,"group":{"name":"fleet","enforce":false,"switched":false,"shared_with":["meters"]}}`) {
		t.Fatalf("rules: %s", body)
	}
	// And back: the class lets through again.
	httpDo(t, "PUT", admin+"/api/v1/rules/meters/enforce", "test-token", `{"enforce":false}`, 200)
	dev.MustPublish(t, "alarms/1", "a", mqtttest.CodeSuccess)
}

// TestWouldRefuseOfReloadedRules: a rule a reload adds counts its
// would-refuse messages from the reload on, for a device connected
// before it; GET /api/v1/rules lists it with its count.
func TestWouldRefuseOfReloadedRules(t *testing.T) {
	cfg := testConfig(t.TempDir(), 1000, time.Hour)
	cfg.Admin.Token = "test-token"
	next := cfg
	g := mustStart(t, cfg, Deps{Load: func() (config.Config, error) { return next, nil }})
	admin := "http://" + g.AdminAddr().String()
	dev := mqtttest.Dial5(t, g.Addr().String(), "trial-1")
	off := false
	next.Limits.Rules = []config.Rule{{Name: "trial", Match: config.Match{ClientID: "trial-*"},
		Quota: config.Quota{Limit: 1, Window: config.Duration(time.Hour), Enforce: &off}}}
	if err := next.Validate(); err != nil {
		t.Fatal(err)
	}
	httpDo(t, "POST", admin+"/api/v1/reload", "test-token", "", 200)
	for range 3 { // 1 within the quota, 2 it would refuse
		dev.MustPublish(t, "devices/trial-1/t", "x", mqtttest.CodeSuccess)
	}
	if body := httpGet(t, admin+"/api/v1/rules", "test-token"); body != `{"rules":[{"rule":"trial","enforce":false,"would_refuse":2}]}`+"\n" {
		t.Fatalf("rules after the reload: %s, want trial would refuse 2", body)
	}
}
