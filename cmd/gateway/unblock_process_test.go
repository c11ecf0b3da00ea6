package main

import (
	"testing"
	"time"
)

// TestUnblockDurableProcess: an unblock is durable when it is
// acknowledged. Quota 2 per minute, block after 3 refusals within a
// minute: the device publishes 5 (blocked at the third refusal), its
// refusals reach the data file with a snapshot, `gateway quota unblock`
// lifts the block, and the gateway is killed (kill -9) at once, before
// its next snapshot (every 2 s). After the restart the device is not
// blocked, and its first refusals do not block it again: the refusals
// that led to the block were forgotten in the data file too (an earlier
// build blocked it again for an hour at its first refusal). Three new
// refusals block it again.
func TestUnblockDurableProcess(t *testing.T) {
	t.Setenv("GATEWAY_ADMIN_TOKEN", "")
	t.Setenv("GATEWAY_ADMIN_ADDR", "")
	dir := t.TempDir()
	cfg := writeConfig(t, `persist: {snapshot_interval: 2s}
limits:
  default: {limit: 2, window: 1m, block: {after: 3, within: 1m, for: 1h}}
`)
	args := []string{"--config", cfg, "--log-level", "debug"}
	g := startGW(t, dir, args...)
	c := dial5(t, g.mqtt, "r1")
	c.mustPublish(t, "devices/r1", "1", codeSuccess)
	c.mustPublish(t, "devices/r1", "2", codeSuccess)
	c.mustPublish(t, "devices/r1", "3", codeQuotaExceeded)
	c.mustPublish(t, "devices/r1", "4", codeQuotaExceeded)
	_, _, _ = c.PublishReason("devices/r1", "5") // the third refusal: blocked
	waitLost(t, c, "the blocked device's connection did not end")
	g.waitLine(blockedRE, 10*time.Second)
	g.waitLine(snapshotRE, 10*time.Second) // the refusals on disk
	code, out, errOut := runBinary(t, "quota", "unblock", "r1", "--admin-addr", g.admin, "--data-dir", g.dir)
	g.kill()
	if code != 0 || out != "device r1: unblocked\n" {
		t.Fatalf("unblock: exit %d, %q, %q", code, out, errOut)
	}

	g = startGW(t, dir, args...)
	defer g.stop()
	if code, st := g.call(t, "GET", "/api/v1/devices/r1", ""); code != 200 || st["blocked_until"] != nil {
		t.Fatalf("r1 after the restart: %d %v, want not blocked", code, st)
	}
	c = dial5(t, g.mqtt, "r1")
	for i := range 2 {
		if code, err := c.publish("devices/r1", "after"); err != nil || code != codeQuotaExceeded {
			t.Fatalf("publish %d after the unblock and the crash: PUBACK 0x%02x, %v; want 0x97 and no block; stderr:\n%s", i, code, err, g.stderr())
		}
	}
	if code, st := g.call(t, "GET", "/api/v1/devices/r1", ""); code != 200 || st["blocked_until"] != nil {
		t.Fatalf("r1 after two new refusals: %d %v, want not blocked", code, st)
	}
	_, _, _ = c.PublishReason("devices/r1", "third")
	waitLost(t, c, "the device was not blocked again at its third new refusal")
}

// waitLost waits up to 10 s for c's connection to end, failing with
// msg if it does not.
func waitLost(t *testing.T, c *client5, msg string) {
	t.Helper()
	select {
	case <-c.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal(msg)
	}
}
