package fleet

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
)

// TestGatewayConfigTenantGroup: with a tenant group, the configuration a
// fleet gateway is started with (written and read back as the gateway
// reads it) puts the one-tenant phase's devices, and only them, in the
// group of the given windows, each keeping the fleet's quota as its
// own; without one, no rule is written.
func TestGatewayConfigTenantGroup(t *testing.T) {
	quota := devicelimit.Quota{Limit: 5, Window: 10 * time.Second, Policy: devicelimit.PolicyDrop}
	windows, err := ParseTenantGroup("2000/10s,4MiB/1m")
	if err != nil {
		t.Fatal(err)
	}
	load := func(spec GatewaySpec) config.Config {
		t.Helper()
		dir := t.TempDir()
		cfg, err := gatewayConfig(spec, "127.0.0.1:1883", dir)
		if err != nil {
			t.Fatal(err)
		}
		file, err := writeConfigFile(dir, cfg)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		back, err := config.Parse(f)
		if err == nil {
			err = back.Validate()
		}
		if err != nil {
			t.Fatalf("the written configuration: %v", err)
		}
		return back
	}
	spec := GatewaySpec{Redis: []string{"127.0.0.1:6379"}, Quota: quota, Decisions: "owner", TenantGroup: windows}
	res, err := load(spec).Resolver()
	if err != nil {
		t.Fatal(err)
	}
	tenant := split(Share{Devices: 3}, TenantPrefix, 2)[1]
	id := fmt.Sprintf(tenant.IDPattern, 0)
	m := res.GroupOf(id, "")
	if m.Name != TenantGroupName || !slices.Equal(m.Quota.Limits(), windows) {
		t.Fatalf("device %s is in group %q of %v, want %q of %v", id, m.Name, m.Quota.Limits(), TenantGroupName, windows)
	}
	if q, _ := res.Rule(id, ""); !slices.Equal(q.Limits(), quota.Limits()) || q.Policy != quota.Policy {
		t.Fatalf("device %s has the quota %v, want the fleet's %v", id, q.Limits(), quota.Limits())
	}
	p1 := fmt.Sprintf(split(Share{Devices: 1}, "p1", 1)[0].IDPattern, 0)
	if m := res.GroupOf(p1, ""); m.Name != "" {
		t.Fatalf("phase 1's device %s is in group %q, want none", p1, m.Name)
	}
	spec.TenantGroup = nil
	if rules := load(spec).Limits.Rules; len(rules) != 0 {
		t.Fatalf("%d rules without a tenant group, want none", len(rules))
	}
}

// TestParseTenantGroup: bad windows for the tenant group are refused
// with an error naming the value.
func TestParseTenantGroup(t *testing.T) {
	for _, bad := range []string{"", "acme", "0/10s", "10/0s", "10/10s,"} {
		if _, err := ParseTenantGroup(bad); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
			t.Errorf("ParseTenantGroup(%q): %v, want an error naming it", bad, err)
		}
	}
	if ls, err := ParseTenantGroup("20000/10s"); err != nil || len(ls) != 1 || ls[0].N != 20000 || ls[0].Window != 10*time.Second {
		t.Errorf("ParseTenantGroup(20000/10s) = %v, %v", ls, err)
	}
}
