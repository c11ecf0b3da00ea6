//go:build linux

package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"golang.org/x/sys/unix"

	"github.com/devicegate/devicegate/internal/freeport"
	"github.com/devicegate/devicegate/internal/poll"
)

// mountSmallDisk mounts a tmpfs of size (mount's syntax: "20m") on a
// new directory, unmounted when the test ends (after the processes the
// test starts later are stopped: cleanups run last in, first out). The
// test fails, saying why, when it cannot mount (it needs root): it never
// skips.
func mountSmallDisk(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs of %s on %s (the test needs root, or CAP_SYS_ADMIN, to make a small disk): %v: %s", size, dir, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// healthSample is one answer of /healthz.
type healthSample struct {
	at   time.Time
	code int
}

// pollHealth asks addr's /healthz every 10 ms until stop is closed.
func pollHealth(addr string, stop <-chan struct{}) func() []healthSample {
	var mu sync.Mutex
	var got []healthSample
	done := make(chan struct{})
	go func() {
		defer close(done)
		c := &http.Client{Timeout: 2 * time.Second}
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			at := time.Now()
			resp, err := c.Get("http://" + addr + "/healthz")
			code := 0
			if err == nil {
				code = resp.StatusCode
				resp.Body.Close()
			}
			mu.Lock()
			got = append(got, healthSample{at, code})
			mu.Unlock()
		}
	}()
	return func() []healthSample {
		<-done
		mu.Lock()
		defer mu.Unlock()
		return got
	}
}

// TestDiskFloorProcess: the gateway's data directory on a 20 MiB disk (a
// tmpfs), its upstream (a real Mosquitto) stopped while 20 devices
// publish 2 KiB messages: the forward log fills the disk until the
// free-space floor (persist.min_free_bytes: 4MiB) stops the appends,
// before the disk is full (no write fails for want of space). From
// then on, under overflow refuse_new, devices are refused (0x97),
// counted in forward status (low_space) and /healthz answers 503 every
// time it is asked; once the upstream is back the backlog drains,
// /healthz answers 200, the devices are acknowledged again, and every
// message ever acknowledged is upstream, in order per device.
func TestDiskFloorProcess(t *testing.T) {
	disk := mountSmallDisk(t, "20m")
	dest := mosquittoDest(t)
	conf := filepath.Join(t.TempDir(), "gateway.yaml")
	yaml := fmt.Sprintf("persist: {min_free_bytes: 4MiB}\nforward: [{name: cloud, to: %q, topics: [\"devices/#\"], overflow: refuse_new}]\n", dest.to)
	if err := os.WriteFile(conf, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	g := startGW(t, disk, "--config", conf, "--mqtt-addr", addr, "--limit", "100000", "--window", "1s")
	upstream := func() map[string]any {
		code, v := g.call(t, "GET", "/api/v1/forward", "")
		if code != 200 {
			t.Fatalf("GET /api/v1/forward: %d %v", code, v)
		}
		return v["upstreams"].([]any)[0].(map[string]any)
	}
	poll.Until(t, 10*time.Second, "the upstream connection", func() bool { return upstream()["connected"].(float64) == 1 })

	stopHealth := make(chan struct{})
	samples := pollHealth(g.admin, stopHealth)
	f := startFleetPadded(addr, 20, 20*time.Millisecond, 2048)
	poll.Until(t, 20*time.Second, "traffic upstream", func() bool { return upstream()["forwarded"].(float64) > 200 })
	dest.down()
	poll.Until(t, 60*time.Second, "devices refused at the floor", func() bool { return f.refused.Load() > 0 })
	floorAt := time.Now()
	// At the floor for a while: many refusals more.
	poll.Until(t, 30*time.Second, "500 refusals at the floor", func() bool { return f.refused.Load() > 500 })
	var st unix.Statfs_t
	if err := unix.Statfs(disk, &st); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(disk, "devicegate.db"))
	if err != nil {
		t.Fatal(err)
	}
	u := upstream()
	t.Logf("at the floor: %.0f messages (%.0f record bytes) waiting, data file %d bytes, %d bytes free on the disk; %.0f refused for the floor",
		u["backlog_messages"], u["backlog_bytes"], fi.Size(), int64(st.Bavail)*st.Bsize, u["low_space"])
	if u["low_space"].(float64) == 0 || u["refused"].(float64) < u["low_space"].(float64) {
		t.Fatalf("forward status at the floor: %v; want refusals counted in low_space", u)
	}
	if _, m := g.raw(t, "", "GET", "/metrics", ""); !strings.Contains(string(m), "\ndevicegate_persist_failing 1\n") ||
		!strings.Contains(string(m), `devicegate_forward_low_space_total{upstream="cloud"}`) {
		t.Fatal("metrics at the floor: want devicegate_persist_failing 1 and devicegate_forward_low_space_total")
	}
	probe := connect5(addr, "probe")
	if probe == nil {
		t.Fatal("an MQTT 5 device cannot connect at the floor")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	resp, err := probe.Publish(ctx, &paho.Publish{Topic: "devices/probe/t", QoS: 1, Payload: []byte("1")})
	cancel()
	_ = probe.Disconnect(&paho.Disconnect{})
	if resp == nil || resp.ReasonCode != 0x97 || resp.Properties == nil || !strings.Contains(resp.Properties.ReasonString, "free-space floor") {
		t.Fatalf("a publish at the floor: %+v, %v; want 0x97 saying the disk is at its free-space floor", resp, err)
	}
	code, out, errOut := runBinary(t, "forward", "status", "--admin-addr", g.admin, "--token", g.token)
	if code != 0 || !strings.Contains(out, "refused or dropped since start: the data file's disk at its free-space floor") {
		t.Fatalf("forward status at the floor: exit %d\n%s%s", code, out, errOut)
	}
	code, body := g.raw(t, "", "GET", "/healthz", "")
	if code != 503 || !strings.Contains(string(body), "below persist.min_free_bytes 4194304") {
		t.Fatalf("/healthz at the floor: %d %s, want 503 naming the floor", code, body)
	}
	upAt := time.Now()
	dest.up()
	poll.Until(t, 60*time.Second, "the backlog drained", func() bool { return upstream()["backlog_messages"].(float64) < 50 })
	poll.Until(t, 20*time.Second, "/healthz ok again", func() bool { code, _ := g.raw(t, "", "GET", "/healthz", ""); return code == 200 })
	ackedAtRecovery := 0
	for i := range f.acked {
		ackedAtRecovery += int(f.acked[i].Load())
	}
	poll.Until(t, 20*time.Second, "devices acknowledged again", func() bool {
		n := 0
		for i := range f.acked {
			n += int(f.acked[i].Load())
		}
		return n > ackedAtRecovery+100
	})
	acked := f.halt()
	close(stopHealth)
	var missing, dups int
	var order string
	poll.Until(t, 60*time.Second, "every acknowledged message upstream", func() bool {
		missing, order, dups = dest.log.check(acked)
		return missing == 0
	})
	g.stop()
	if order != "" {
		t.Fatalf("out of order upstream: %s", order)
	}
	if strings.Contains(g.stderr(), "no space left on device") {
		t.Fatalf("a write failed for want of space: the floor did not keep the disk from filling:\n%s", g.stderr())
	}
	// /healthz: 503 from the floor (by the time the first device was
	// seen refused) until the upstream came back; 200 at the end.
	var first503 time.Time
	ok, bad := 0, 0
	for _, s := range samples() {
		if s.code == 503 && first503.IsZero() {
			first503 = s.at
		}
		if s.at.After(floorAt) && s.at.Before(upAt) {
			if s.code == 503 {
				ok++
			} else {
				bad++
				t.Errorf("/healthz answered %d at %s, at the floor (refusals from %s, upstream back at %s)", s.code, s.at.Format(time.StampMilli),
					floorAt.Format(time.StampMilli), upAt.Format(time.StampMilli))
			}
		}
	}
	// Every sample sent after the first refusal was seen answered 503
	// (above); the first 503 may come up to a sampling period after it
	// (a sample every 10 ms, slower on a loaded machine).
	if first503.IsZero() || first503.After(floorAt.Add(time.Second)) || ok == 0 {
		t.Fatalf("first 503 at %s, devices refused by %s; %d samples at the floor", first503.Format(time.StampMilli), floorAt.Format(time.StampMilli), ok)
	}
	total := 0
	for _, n := range acked {
		total += n
	}
	t.Logf("%d messages acknowledged, all upstream (%d duplicates); %d refusals; /healthz 503 in all %d samples at the floor (%d not)",
		total, dups, f.refused.Load(), ok, bad)
}
