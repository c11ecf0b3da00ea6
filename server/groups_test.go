package server

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/mqtttest"
	"github.com/devicegate/devicegate/internal/poll"
)

// groupConfig is a gateway whose devices "tenant-NAME-*" are in the
// group NAME: 3 messages per hour each, 10 per hour for the group.
func groupConfig(t *testing.T, dir string) config.Config {
	t.Helper()
	cfg := testConfig(dir, 1000, time.Hour)
	cfg.Admin.Token = "test-token"
	hour := config.Duration(time.Hour)
	cfg.Limits.Rules = []config.Rule{{Name: "tenants", Match: config.Match{ClientID: "tenant-{tenant}-*"},
		Quota: config.Quota{Limit: 3, Window: hour},
		Group: &config.Group{Name: "{tenant}", Quota: config.Quota{Limit: 10, Window: hour}}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// groupStatus is what the tests read of GET /api/v1/groups/{name}.
type groupStatus struct {
	Group  string
	Source string
	Quota  struct {
		Enforce *bool
		Windows []struct{ Messages, Used, Remaining int }
	}
	Connected int
}

func getGroup(t *testing.T, admin, name string) groupStatus {
	t.Helper()
	var st groupStatus
	body := httpGet(t, admin+"/api/v1/groups/"+name, "test-token")
	if err := json.Unmarshal([]byte(body), &st); err != nil || len(st.Quota.Windows) != 1 {
		t.Fatalf("group %s: %s (%v)", name, body, err)
	}
	return st
}

// TestGroupsCapTenant: five devices of tenant acme share its 10 messages
// while each keeps its own 3; the refusal by the group says so; another
// tenant is served; the group's status, the device's, the metrics, a
// group override (bad input changing nothing), shadow mode on the group
// and a restart all hold.
func TestGroupsCapTenant(t *testing.T) {
	dir := t.TempDir()
	g := mustStart(t, groupConfig(t, dir), Deps{})
	admin := "http://" + g.AdminAddr().String()
	addr := g.Addr().String()
	var devs []*mqtttest.Client5
	admitted := 0
	for i := range 5 {
		id := fmt.Sprintf("tenant-acme-%d", i)
		d := mqtttest.Dial5(t, addr, id)
		devs = append(devs, d)
		for k := range 4 {
			code, reason, err := d.PublishReason("devices/"+id+"/t", "x")
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case code == mqtttest.CodeSuccess:
				admitted++
			case k == 3 && admitted <= 10 && strings.HasPrefix(reason, "quota exceeded: 3 messages per 1h0m0s"):
				// The device's own quota.
			case admitted == 10 && strings.HasPrefix(reason, "quota of group acme exceeded: 10 messages per 1h0m0s, retry after "):
			default:
				t.Fatalf("%s message %d: 0x%02x %q (admitted so far %d)", id, k, code, reason, admitted)
			}
		}
	}
	if admitted != 10 {
		t.Fatalf("tenant acme admitted %d, want its group's 10", admitted)
	}
	beta := mqtttest.Dial5(t, addr, "tenant-beta-1")
	for range 3 {
		beta.MustPublish(t, "devices/tenant-beta-1/t", "x", mqtttest.CodeSuccess)
	}
	st := getGroup(t, admin, "acme")
	if st.Source != "rule" || st.Connected != 5 || st.Quota.Windows[0].Used != 10 || st.Quota.Windows[0].Remaining != 0 {
		t.Fatalf("group acme: %+v", st)
	}
	if body := httpGet(t, admin+"/api/v1/devices/tenant-acme-0", "test-token"); !strings.Contains(body, `"group":"acme"`) {
		t.Fatalf("device status lacks its group: %s", body)
	}
	if body := httpGet(t, admin+"/api/v1/groups", "test-token"); !strings.Contains(body, `"group":"acme","label":"{tenant}"`) || !strings.Contains(body, `"group":"beta"`) {
		t.Fatalf("groups: %s", body)
	}
	m := httpGet(t, admin+"/metrics", "")
	for _, want := range []string{
		`devicegate_group_publishes_total{group="{tenant}",outcome="admitted"} 13`,
		// acme-3's last 3 and all 4 of acme-4 (refused messages count
		// in no window, so acme-4's own quota never fills).
		`devicegate_group_publishes_total{group="{tenant}",outcome="refused"} 7`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(m, "group"))
		}
	}

	// A group override raises the cap; bad input changes nothing.
	httpDo(t, "PUT", admin+"/api/v1/groups/acme/quota", "test-token", `{"limit":12,"window":"1h"}`, 200)
	for _, bad := range []string{`{"limit":12,"window":"1h","policy":"drop"}`, `{"limit":0,"window":"1h"}`, `{"limit":5,"window":"1h","block":{"after":1,"within":"1m","for":"1m"}}`} {
		httpDo(t, "PUT", admin+"/api/v1/groups/acme/quota", "test-token", bad, 400)
	}
	devs[4].MustPublish(t, "devices/tenant-acme-4/t", "x", mqtttest.CodeSuccess)
	devs[4].MustPublish(t, "devices/tenant-acme-4/t", "x", mqtttest.CodeSuccess)
	devs[4].MustPublish(t, "devices/tenant-acme-4/t", "x", mqtttest.CodeQuotaExceeded)
	if st := getGroup(t, admin, "acme"); st.Source != "override" || st.Quota.Windows[0].Messages != 12 || st.Quota.Windows[0].Used != 12 {
		t.Fatalf("group acme after the override: %+v", st)
	}
	// Shadow mode on the group: what it would refuse passes, counted.
	httpDo(t, "PUT", admin+"/api/v1/groups/acme/quota", "test-token", `{"limit":12,"window":"1h","enforce":false}`, 200)
	devs[3].MustPublish(t, "devices/tenant-acme-3/t", "x", mqtttest.CodeSuccess)
	if m := httpGet(t, admin+"/metrics", ""); !strings.Contains(m, `devicegate_group_publishes_total{group="{tenant}",outcome="would_refuse"} 1`) {
		t.Fatalf("metrics after a shadow group's refusal:\n%s", grepLines(m, "group"))
	}
	if st := getGroup(t, admin, "acme"); st.Quota.Enforce == nil || *st.Quota.Enforce || st.Quota.Windows[0].Used != 12 {
		t.Fatalf("shadow group acme: %+v", st)
	}
	httpDo(t, "DELETE", admin+"/api/v1/groups/acme/quota", "test-token", "", 200)
	httpDo(t, "DELETE", admin+"/api/v1/groups/acme/quota", "test-token", "", 404)
	devs[3].MustPublish(t, "devices/tenant-acme-3/t", "x", mqtttest.CodeQuotaExceeded)

	// The group's window survives a restart; before it, with its
	// devices gone, the group is still known here.
	for _, d := range append(devs, beta) {
		d.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for st := getGroup(t, admin, "acme"); st.Connected != 0; st = getGroup(t, admin, "acme") {
		if time.Now().After(deadline) {
			t.Fatalf("group acme after its devices left: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	closeGateway(t, g)
	g = mustStart(t, groupConfig(t, dir), Deps{})
	admin = "http://" + g.AdminAddr().String()
	again := mqtttest.Dial5(t, g.Addr().String(), "tenant-acme-9")
	code, reason, err := again.PublishReason("devices/tenant-acme-9/t", "x")
	if err != nil || code != mqtttest.CodeQuotaExceeded || !strings.Contains(reason, "group acme") {
		t.Fatalf("a new device of acme after the restart: 0x%02x %q %v; want refused by the group's restored window", code, reason, err)
	}
	if st := getGroup(t, admin, "acme"); st.Quota.Windows[0].Used != 12 {
		t.Fatalf("restored group acme: %+v", st)
	}
	httpDo(t, "GET", admin+"/api/v1/groups/nobody", "test-token", "", 404)
	if body := httpDo(t, "GET", admin+"/api/v1/groups/a%00b", "test-token", "", 400); !strings.Contains(body, "invalid group name: must be 1 to 256 bytes without NUL") {
		t.Fatalf("a group name with a NUL: %s", body)
	}
}

// TestGroupSharedInCluster: tenant acme's devices spread across two
// gateways sharing Redis get the group's 10 in all; an override set on
// one gateway caps the group on the other.
func TestGroupSharedInCluster(t *testing.T) {
	a, b := twoGateways(t, func(dir string) config.Config { return groupConfig(t, dir) })
	admitted := 0
	for i := range 6 {
		gw := a
		if i%2 == 1 {
			gw = b
		}
		id := fmt.Sprintf("tenant-acme-%d", i)
		d := mqtttest.Dial5(t, gw.Addr().String(), id)
		for range 3 {
			code, _, err := d.PublishReason("devices/"+id+"/t", "x")
			if err != nil {
				t.Fatal(err)
			}
			if code == mqtttest.CodeSuccess {
				admitted++
			}
		}
		d.Close()
	}
	if admitted != 10 {
		t.Fatalf("tenant acme across two gateways admitted %d, want its group's 10", admitted)
	}
	httpDo(t, "PUT", "http://"+a.AdminAddr().String()+"/api/v1/groups/acme/quota", "test-token", `{"limit":11,"window":"1h"}`, 200)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, ok := b.resolver.Override(devicelimit.GroupKey("acme"), b.clock.Now()); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the group override set on A never reached B")
		}
		time.Sleep(10 * time.Millisecond)
	}
	d := mqtttest.Dial5(t, b.Addr().String(), "tenant-acme-7")
	d.MustPublish(t, "devices/tenant-acme-7/t", "x", mqtttest.CodeSuccess)
	d.MustPublish(t, "devices/tenant-acme-7/t", "x", mqtttest.CodeQuotaExceeded)
}

// TestGroupsListedOnEveryGateway: in a cluster, a group whose devices
// are all on gateway A is known to gateway B's admin API too (the
// shared registry): listed, and its status shows the shared window.
func TestGroupsListedOnEveryGateway(t *testing.T) {
	a, b := twoGateways(t, func(dir string) config.Config { return groupConfig(t, dir) })
	d := mqtttest.Dial5(t, a.Addr().String(), "tenant-acme-1")
	for range 2 {
		d.MustPublish(t, "devices/tenant-acme-1/t", "x", mqtttest.CodeSuccess)
	}
	adminB := "http://" + b.AdminAddr().String()
	poll.Until(t, 10*time.Second, "acme listed on B", func() bool {
		return strings.Contains(httpGet(t, adminB+"/api/v1/groups", "test-token"), `"group":"acme"`)
	})
	st := getGroup(t, adminB, "acme")
	if st.Source != "rule" || st.Connected != 0 || st.Quota.Windows[0].Messages != 10 || st.Quota.Windows[0].Used != 2 {
		t.Fatalf("acme on B: %+v; want the rule's 10 per hour, 2 used, no device connected here", st)
	}
	if st := getGroup(t, "http://"+a.AdminAddr().String(), "acme"); st.Connected != 1 || st.Quota.Windows[0].Used != 2 {
		t.Fatalf("acme on A: %+v", st)
	}
	httpDo(t, "GET", adminB+"/api/v1/groups/beta", "test-token", "", 404)
}

// TestGroupOverrideSurvivesRestart: a group override is kept in the data
// directory like a device's and judges the group after a restart.
func TestGroupOverrideSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	g := mustStart(t, groupConfig(t, dir), Deps{})
	httpDo(t, "PUT", "http://"+g.AdminAddr().String()+"/api/v1/groups/acme/quota", "test-token", `{"limit":1,"window":"1h"}`, 200)
	closeGateway(t, g)
	g = mustStart(t, groupConfig(t, dir), Deps{})
	if st := getGroup(t, "http://"+g.AdminAddr().String(), "acme"); st.Source != "override" || st.Quota.Windows[0].Messages != 1 {
		t.Fatalf("group acme after a restart: %+v", st)
	}
	d := mqtttest.Dial5(t, g.Addr().String(), "tenant-acme-1")
	d.MustPublish(t, "devices/tenant-acme-1/t", "x", mqtttest.CodeSuccess)
	code, reason, err := d.PublishReason("devices/tenant-acme-1/t", "x")
	if err != nil || code != mqtttest.CodeQuotaExceeded || !strings.HasPrefix(reason, "quota of group acme exceeded: 1 messages per 1h0m0s") {
		t.Fatalf("second message under the restored override: 0x%02x %q %v", code, reason, err)
	}
	if body := httpGet(t, "http://"+g.AdminAddr().String()+"/api/v1/quotas", "test-token"); strings.Contains(body, "acme") {
		t.Fatalf("a group override listed among the devices' overrides: %s", body)
	}
}
