package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestCrashAfterCrashProcess is the three-crash run: policy drop, 20
// messages per 10 s, a snapshot every second, and the gateway killed
// (kill -9) three times 600 ms apart while one device publishes QoS 1
// every 20 ms; after the last restart the device goes on until it has
// been admitted again. With persist.after_crash: charge no 10 s interval
// holds more than 20 admissions. With forgive, each restart before the
// first snapshot forgot the run's admissions, and the same run admits
// about 20 per run (the test checks more than 20, so that it shows what
// the charge prevents).
func TestCrashAfterCrashProcess(t *testing.T) {
	for _, mode := range []string{"charge", "forgive"} {
		t.Run(mode, func(t *testing.T) {
			const limit, window = 20, 10 * time.Second
			dir := t.TempDir()
			cfg := filepath.Join(t.TempDir(), "gateway.yaml")
			if err := os.WriteFile(cfg, []byte("persist: {snapshot_interval: 1s, after_crash: "+mode+"}\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			args := []string{"--config", cfg, "--limit", fmt.Sprint(limit), "--window", window.String()}
			var all []time.Time
			for range 3 {
				p, addr, _ := startOn(t, dir, args...)
				c := dial5(t, addr, "meter-1")
				killed := make(chan struct{})
				timer := time.AfterFunc(600*time.Millisecond, func() {
					p.cmd.Process.Kill()
					close(killed)
				})
				all = append(all, publishEvery(t, c, 20*time.Millisecond, killed)...)
				p.wait(10 * time.Second)
				timer.Stop()
			}
			p, addr, _ := startOn(t, dir, args...)
			c := dial5(t, addr, "meter-1")
			// Until the device is admitted again after the last restart
			// (or 14 s: the charge lasts at most T and a bucket past
			// the last snapshot's bound).
			before := len(all)
			done := make(chan struct{})
			deadline := time.AfterFunc(14*time.Second, func() { close(done) })
			stop := make(chan struct{})
			go func() {
				select {
				case <-done:
				case <-stop:
				}
			}()
			after := publishUntilAdmitted(t, c, 20*time.Millisecond, done)
			deadline.Stop()
			close(stop)
			p.stop()
			all = append(all, after...)
			most := maxIn(all, window-50*time.Millisecond)
			t.Logf("after_crash %s: %d admissions in 3 runs killed after 600 ms and %d after the last restart; most in any %s: %d (limit %d)",
				mode, before, len(after), window-50*time.Millisecond, most, limit)
			t.Logf("admissions at (ms from the first): %v", offsets(all))
			switch {
			case mode == "charge" && most > limit:
				t.Errorf("%d admissions within %s, more than %d; at (ms from the first): %v", most, window, limit, offsets(all))
			case mode == "charge" && len(after) == 0:
				t.Errorf("the device was not admitted again within 14 s of the last restart")
			case mode == "forgive" && most <= limit:
				t.Errorf("forgive kept the limit (%d): the run does not show what the charge prevents", most)
			}
		})
	}
}

// publishUntilAdmitted publishes every interval until one message is
// admitted or stop is closed, and returns the admission times.
func publishUntilAdmitted(t *testing.T, c *client5, interval time.Duration, stop <-chan struct{}) []time.Time {
	t.Helper()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return nil
		case <-tick.C:
		}
		code, err := c.publish("devices/meter-1", fmt.Sprint("after ", i))
		if err != nil {
			t.Fatalf("publish after the last restart: %v", err)
		}
		switch code {
		case codeSuccess:
			return []time.Time{time.Now()}
		case codeQuotaExceeded:
		default:
			t.Fatalf("publish %d: PUBACK 0x%02x, want 0x00 or 0x97", i, code)
		}
	}
}
