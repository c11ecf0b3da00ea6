package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// TestResetKillProcess: an operator's reset holds across kill -9. A
// meter uses its whole quota, 3 messages an hour, and its alarms class's
// (2 an hour); a snapshot every hour, so that nothing but the reset
// itself can write the emptied windows before the kill. The reset
// answers 200, the gateway is killed with SIGKILL, and after the restart
// the meter is admitted its whole quota again, on its own windows and
// its class's, as the reset promised, and nothing is charged: the reset
// closed the emptied windows' leases. Its lease writes held its counts
// (docs/durability.md, "How it works"): a reset only in memory let the
// restart restore them and refuse the meter at once (0 admitted on
// both, before the reset was written), and charge both windows.
func TestResetKillProcess(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	yaml := `persist: {snapshot_interval: 1h}
limits:
  rules:
    - name: meters
      match: {client_id: "meter-*"}
      quota: {limit: 3, window: 1h}
      classes:
        - {name: alarms, topics: ["devices/+/alarm/#"], quota: {limit: 2, window: 1h}}
`
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	const id = "meter-1"
	own, alarm := "devices/"+id, "devices/"+id+"/alarm/door"
	g := startGW(t, dir, "--config", cfg)
	c := dial5(t, g.mqtt, id)
	for i := range 3 {
		c.mustPublish(t, own, fmt.Sprint("reading ", i), codeSuccess)
	}
	c.mustPublish(t, own, "over", codeQuotaExceeded)
	for i := range 2 {
		c.mustPublish(t, alarm, fmt.Sprint("alarm ", i), codeSuccess)
	}
	c.mustPublish(t, alarm, "alarm over", codeQuotaExceeded)

	m := g.mustCall(t, http.StatusOK, http.MethodPost, devicePath(id)+"/reset", "")
	if m["reset"] != true {
		t.Fatalf("POST reset: %v, want reset true", m)
	}
	g.kill()

	g = startGW(t, dir, "--config", cfg)
	defer g.stop()
	if m := chargedRE.FindStringSubmatch(g.stderr()); m == nil || m[1] != "0" {
		t.Errorf("the restart after the reset and kill -9 charged windows (%v), want charged_windows=0; stderr:\n%s", m, g.stderr())
	}
	c = dial5(t, g.mqtt, id)
	for _, k := range []struct {
		topic string
		limit int
	}{{own, 3}, {alarm, 2}} {
		admitted := 0
		for admitted <= k.limit {
			code, reason := c.publishReason(t, k.topic, fmt.Sprint("after the restart ", admitted))
			if code != codeSuccess {
				if code != codeQuotaExceeded {
					t.Fatalf("publish on %s after the restart: 0x%02x %q", k.topic, code, reason)
				}
				break
			}
			admitted++
		}
		t.Logf("after reset, kill -9 and restart: %d admitted on %s (quota %d)", admitted, k.topic, k.limit)
		if admitted != k.limit {
			t.Errorf("%s: %d admitted on %s after its reset (200), kill -9 and the restart, want %d; stderr:\n%s",
				id, admitted, k.topic, k.limit, g.stderr())
		}
	}
}
