package main

import (
	"fmt"
	"regexp"
	"testing"
	"time"
)

// The crash bound with real gateway processes killed with SIGKILL
// (docs/durability.md): what a crash costs a device near its quota, and
// that it never blocks a device that was calm before it.

// retryAfter reads the "retry after" of a refusal's reason string.
func retryAfter(t *testing.T, reason string) time.Duration {
	t.Helper()
	m := retryAfterRE.FindStringSubmatch(reason)
	if m == nil {
		t.Fatalf("refusal %q says no retry after", reason)
	}
	d, err := time.ParseDuration(m[1])
	if err != nil {
		t.Fatalf("refusal %q: retry after %q: %v", reason, m[1], err)
	}
	return d
}

// TestCrashNearQuotaCostsALeaseProcess is the repro of a crash near the
// quota: 20 per 1 s (a lease of 2), a snapshot every second. Right
// after a snapshot a device sends 25 (20 admitted), the gateway is
// killed and started again. The device's window holds its 20 until a
// second after they were admitted, as it would without the crash, plus
// at most one lease: it is admitted again when they leave (an earlier
// build held them until the last possible lost admission, two snapshot
// intervals after the last snapshot, and 0 of 25 were admitted then),
// and then gets at least 20 - 2 of 25. No interval of 1 s holds more
// than 20 admissions across the crash.
func TestCrashNearQuotaCostsALeaseProcess(t *testing.T) {
	const limit, lease, window = 20, 2, time.Second
	dir := t.TempDir()
	args := []string{"--config", writeConfig(t, "persist: {snapshot_interval: 1s}\n"), "--limit", fmt.Sprint(limit), "--window", window.String()}
	p, addr, _ := startOn(t, dir, args...)
	c := dial5(t, addr, "meter-1")
	c.mustPublish(t, "devices/meter-1", "first", codeSuccess) // the window exists
	admitted := []time.Time{time.Now()}
	p.waitLine(snapshotRE, 10*time.Second)
	p.waitLine(snapshotRE, 10*time.Second) // one just written: the crash is as far from the next as can be
	admitted = append(admitted, burst(t, c, "burst", 25)...)
	sent := time.Now()
	if len(admitted) != 1+limit {
		t.Fatalf("before the crash %d of 25 admitted, want %d", len(admitted)-1, limit)
	}
	p.kill()

	p, addr, _ = startOn(t, dir, args...)
	defer p.stop()
	if !regexp.MustCompile(uncleanMsg).MatchString(p.stderr()) {
		t.Fatalf("the restart did not see the crash; stderr:\n%s", p.stderr())
	}
	c = dial5(t, addr, "meter-1")
	// When the window says it admits again: at once, or at the retry
	// after of its first refusal.
	code, reason := c.publishReason(t, "devices/meter-1", "after")
	again := time.Now()
	if code == codeSuccess {
		admitted = append(admitted, again)
	} else {
		again = again.Add(retryAfter(t, reason))
	}
	// The 20 leave a window (and its oldest bucket, 50 ms) after they
	// were admitted; 300 ms for the clocks of client and gateway.
	if late := again.Sub(sent); late > window+window/20+300*time.Millisecond {
		t.Errorf("after the crash the device is admitted again %s after its 20 were admitted, want at most %s (%q)", late.Round(time.Millisecond), window+window/20+300*time.Millisecond, reason)
	}
	n := 0
	if code == codeSuccess {
		n = 1
	} else {
		deadline := make(chan struct{})
		timer := time.AfterFunc(5*time.Second, func() { close(deadline) })
		after := publishUntilAdmitted(t, c, 20*time.Millisecond, deadline)
		timer.Stop()
		if len(after) == 0 {
			t.Fatal("the device was not admitted again within 5 s of the restart")
		}
		admitted = append(admitted, after...)
		n = len(after)
	}
	// The quota less a lease is due in a window clear of every admission
	// before the crash: on a loaded machine the 25 of the burst took a
	// while to send, and the first readmission comes when its first one
	// leaves the window, not its last. The gateway is another process on
	// the real clock: wait for that instant (its oldest bucket, 50 ms,
	// included) before the second burst.
	if clear := sent.Add(window + window/20); time.Now().Before(clear) {
		time.Sleep(time.Until(clear))
	}
	more := burst(t, c, "again", 24)
	admitted = append(admitted, more...)
	n += len(more)
	most := maxIn(admitted, window-50*time.Millisecond)
	t.Logf("after kill -9: admitted again %s after the burst; then %d of 25; most in any %s: %d", again.Sub(sent).Round(time.Millisecond), n, window-50*time.Millisecond, most)
	if n < limit-lease {
		t.Errorf("after the crash %d of 25 admitted once the window passed, want at least %d (the quota less a lease)", n, limit-lease)
	}
	if most > limit {
		t.Errorf("%d admissions within %s across the crash, more than %d: %v", most, window, limit, offsets(admitted))
	}
}

// burst publishes n messages to devices/meter-1 at once and returns
// when each admitted one was acknowledged.
func burst(t *testing.T, c *client5, what string, n int) []time.Time {
	t.Helper()
	var admitted []time.Time
	for i := range n {
		code, err := c.publish("devices/meter-1", fmt.Sprint(what, " ", i))
		if err != nil {
			t.Fatalf("%s publish %d: %v", what, i, err)
		}
		if code == codeSuccess {
			admitted = append(admitted, time.Now())
		}
	}
	return admitted
}

// TestCrashBlocksNoCalmDeviceNearQuotaProcess: quota 100 per 10 s with
// block after 3 refusals within 1 m for 1 h, and one device publishing
// every 108 ms (93 per 10 s: never refused) through a kill -9. The
// crash costs it at most one lease (10), and the refusals the charge
// causes are not counted toward the block: it is not blocked, and is
// refused at most 10 times after the restart (an earlier build blocked
// it for an hour after 3).
func TestCrashBlocksNoCalmDeviceNearQuotaProcess(t *testing.T) {
	const window, lease = 10 * time.Second, 10
	dir := t.TempDir()
	cfg := writeConfig(t, `persist: {snapshot_interval: 1s}
limits:
  default: {limit: 100, window: 10s, block: {after: 3, within: 1m, for: 1h}}
`)
	p, addr, _ := startOn(t, dir, "--config", cfg)
	c := dial5(t, addr, "calm-1")
	// A window's worth of publishes, then the kill.
	refused := 0
	tick := time.NewTicker(108 * time.Millisecond)
	defer tick.Stop()
	for i := 0; i < 100; i++ {
		<-tick.C
		code, err := c.publish("devices/calm-1", fmt.Sprint(i))
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		if code != codeSuccess {
			refused++
		}
	}
	p.kill()
	if refused > 0 {
		t.Logf("%d refusals before the crash (the machine's load bunched the publishes)", refused)
	}
	g := startGW(t, dir, "--config", cfg)
	defer g.stop()
	c = dial5(t, g.mqtt, "calm-1")
	refused = 0
	// A window's worth again: the charge has left the window at its end.
	for i := 0; i < 100; i++ {
		<-tick.C
		code, err := c.publish("devices/calm-1", fmt.Sprint("after ", i))
		if err != nil {
			t.Fatalf("publish %d after the crash: %v (refused %d); stderr:\n%s", i, err, refused, g.stderr())
		}
		if code != codeSuccess {
			refused++
		}
	}
	code, st := g.call(t, "GET", "/api/v1/devices/calm-1", "")
	t.Logf("after kill -9: %d of 100 refused; device %v", refused, st["blocked_until"])
	if code != 200 || st["blocked_until"] != nil || blockedRE.MatchString(g.stderr()) {
		t.Errorf("calm-1 blocked after the crash: %d %v", code, st)
	}
	if refused > lease {
		t.Errorf("%d refusals after the crash, more than the lease (%d)", refused, lease)
	}
}
