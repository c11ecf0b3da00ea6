package server

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/config"
)

// TestGroupOverrideOfUnknownGroup: an override for a group no configured
// template can make ("acme" when groups are "tenant-{tenant}") answers
// 404 naming the configured groups and sets nothing; one a template can
// make ("tenant-acme", before any of its devices connected) is set.
// Before, any name was accepted and the override silently never applied.
func TestGroupOverrideOfUnknownGroup(t *testing.T) {
	cfg := testConfig(t.TempDir(), 1000, time.Hour)
	cfg.Admin.Token = "test-token"
	cfg.Limits.Rules = []config.Rule{{Name: "tenants", Match: config.Match{ClientID: "t-{tenant}-*"},
		Quota: config.Quota{Limit: 5, Window: config.Duration(time.Hour)},
		Group: &config.Group{Name: "tenant-{tenant}", Quota: config.Quota{Limit: 10, Window: config.Duration(time.Hour)}}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := mustStart(t, cfg, Deps{})
	base := "http://" + g.AdminAddr().String()
	body := httpDo(t, http.MethodPut, base+"/api/v1/groups/acme/quota", "test-token", `{"limit": 20, "window": "1h"}`, http.StatusNotFound)
	if !strings.Contains(body, `no rule makes a group named \"acme\": the configured groups are tenant-{tenant}; nothing was set`) {
		t.Fatalf("404 body: %s", body)
	}
	if list := httpGet(t, base+"/api/v1/groups", "test-token"); strings.Contains(list, `"acme"`) {
		t.Fatalf("the refused override was set: %s", list)
	}
	httpDo(t, http.MethodPut, base+"/api/v1/groups/tenant-acme/quota", "test-token", `{"limit": 20, "window": "1h"}`, http.StatusOK)
}
