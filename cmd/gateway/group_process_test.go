package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestGroupTenantProcess: a real gateway, a tenant of 50 devices capped
// at 100 messages per 10 s (each device 5 per 10 s), every device
// sending 8 at once over MQTT 5: the tenant gets exactly 100 in all,
// no device more than its 5, the backend receives exactly what was
// admitted, another tenant is served in full, and `gateway quota group`
// shows the tenant's window full.
func TestGroupTenantProcess(t *testing.T) {
	t.Setenv("GATEWAY_ADMIN_TOKEN", "")
	t.Setenv("GATEWAY_ADMIN_ADDR", "")
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(cfg, []byte(`limits:
  rules:
    - name: tenants
      match: {client_id: "tenant-{tenant}-*"}
      quota: {limit: 5, window: 10s}
      group:
        name: "{tenant}"
        quota: {limit: 100, window: 10s}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGW(t, t.TempDir(), "--config", cfg)
	defer g.stop()
	sub := subscribe5(t, g.mqtt, "backend", "tenants/#")
	devs := make([]*client5, 50)
	for i := range devs {
		devs[i] = dial5(t, g.mqtt, fmt.Sprintf("tenant-acme-%d", i))
	}
	beta := dial5(t, g.mqtt, "tenant-beta-1")
	start := time.Now()
	admitted := make([]int, len(devs))
	var wg sync.WaitGroup
	for i, d := range devs {
		wg.Go(func() {
			for k := range 8 {
				code, reason, err := d.PublishReason(fmt.Sprintf("tenants/acme/%d", i), fmt.Sprintf("acme-%d-%d", i, k))
				switch {
				case err != nil:
					t.Errorf("device %d: %v", i, err)
					return
				case code == 0:
					admitted[i]++
				case !strings.Contains(reason, "quota of group acme exceeded") && !strings.HasPrefix(reason, "quota exceeded: 5 messages per 10s"):
					t.Errorf("device %d message %d: 0x%02x %q", i, k, code, reason)
				}
			}
		})
	}
	wg.Wait()
	for k := range 5 {
		beta.mustPublish(t, "tenants/beta/1", fmt.Sprint("beta-", k), 0)
	}
	if elapsed := time.Since(start); elapsed > 9*time.Second {
		t.Fatalf("the burst took %v: too long to judge a 10 s window", elapsed)
	}
	total := 0
	for i, n := range admitted {
		if n > 5 {
			t.Errorf("device %d admitted %d, over its own 5 per 10s", i, n)
		}
		total += n
	}
	if total != 100 {
		t.Fatalf("tenant acme admitted %d in all, want its group's 100", total)
	}
	waitUntil(t, "the backend receives 105 messages", 10*time.Second, func() bool { return len(sub.payloads()) >= 105 })
	got := sub.payloads()
	acme := 0
	for _, p := range got {
		if strings.HasPrefix(p, "acme-") {
			acme++
		}
	}
	if len(got) != 105 || acme != 100 {
		t.Fatalf("the backend received %d messages (%d of acme), want 105 (100)", len(got), acme)
	}
	code, out, errOut := runBinary(t, "quota", "group", "acme", "--admin-addr", g.admin, "--data-dir", g.dir)
	if code != 0 || !regexp.MustCompile(`window 1 +100 messages per 10s: used 100, remaining 0`).MatchString(out) ||
		!regexp.MustCompile(`connected +50`).MatchString(out) {
		t.Fatalf("quota group acme: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runBinary(t, "quota", "groups", "--admin-addr", g.admin, "--data-dir", g.dir)
	if code != 0 || !regexp.MustCompile(`(?m)^acme +\{tenant\} +rule +50 +100 messages per 10s$`).MatchString(out) {
		t.Fatalf("quota groups: exit %d\n%s", code, out)
	}
	code, out, _ = runBinary(t, "quota", "set-group", "acme", "--limit", "150", "--window", "10s", "--shadow", "--admin-addr", g.admin, "--data-dir", g.dir)
	if code != 0 || out != "group acme: 150 messages per 10s, shadow mode\n" {
		t.Fatalf("quota set-group: exit %d %q", code, out)
	}
	code, _, errOut = runBinary(t, "quota", "set-group", "acme", "--limit", "0", "--window", "10s", "--admin-addr", g.admin, "--data-dir", g.dir)
	if code == 0 || !strings.Contains(errOut, "limit") {
		t.Fatalf("quota set-group --limit 0: exit %d %q", code, errOut)
	}
	code, out, _ = runBinary(t, "quota", "delete-group", "acme", "--admin-addr", g.admin, "--data-dir", g.dir)
	if code != 0 || out != "group acme: override deleted; the configured quota applies\n" {
		t.Fatalf("quota delete-group: exit %d %q", code, out)
	}
}
