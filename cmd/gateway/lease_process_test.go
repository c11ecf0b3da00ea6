package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
)

var (
	chargedRE         = regexp.MustCompile(`charged_windows=(\d+)`)
	snapshotWindowsRE = regexp.MustCompile(`msg="snapshot written" windows=(\d+) deleted=(\d+)`)
	blockedRE         = regexp.MustCompile(`msg="device blocked" device=(\S+)`)
)

// TestCrashCostsALeaseProcess is the daily-window case of a crash: the
// default quota is 1000 messages a day and 10 per 10 s. A device that
// published and then stayed idle until its leases closed (sixty
// snapshots: two window lengths, at most sixty), one that connected
// as long before and never published, and a device never seen, are
// admitted at once after kill -9, with nothing charged; one that
// connected just before the crash is charged at most a lease; the
// device killed mid-publishing is admitted at once too, and loses at
// most one lease per window (a tenth: 100 of the day, 1 of the 10 s).
func TestCrashCostsALeaseProcess(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	yaml := `persist: {snapshot_interval: 100ms}
limits:
  default: {windows: [{messages: 1000, window: 24h}, {messages: 10, window: 10s}]}
`
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGW(t, dir, "--config", cfg, "--log-level", "debug")
	// A device that connects and never publishes holds the leases its
	// session start asked, and one that published holds its window's,
	// until the collections close them: after sixty idle ones here (two
	// lengths of the daily window, at most sixty: devicelimit/lease.go,
	// idleLimit). A snapshot writes a window only when it admitted or
	// its lease closes: meter-idle's two windows once after its
	// publishes, then each device's two as its leases close (some 6 s
	// later, in one snapshot or two).
	dial5(t, g.mqtt, "meter-quiet")
	idle := dial5(t, g.mqtt, "meter-idle")
	for i := range 3 {
		idle.mustPublish(t, "devices/meter-idle", fmt.Sprint("reading ", i), codeSuccess)
	}
	for written := 0; written < 6; {
		m := g.waitLine(snapshotWindowsRE, 30*time.Second)
		w, err1 := strconv.Atoi(m[1])
		d, err2 := strconv.Atoi(m[2])
		if err1 != nil || err2 != nil {
			t.Fatalf("snapshot line %q", m[0])
		}
		written += w + d // meter-quiet's windows, empty, are deleted as they close
	}
	busy := dial5(t, g.mqtt, "meter-1")
	for i := range 3 {
		busy.mustPublish(t, "devices/meter-1", fmt.Sprint("reading ", i), codeSuccess)
	}
	// Connected just before the crash, not publishing: it may be
	// charged its connect's lease, no more.
	dial5(t, g.mqtt, "meter-new")
	g.kill()

	g = startGW(t, dir, "--config", cfg, "--log-level", "debug")
	defer g.stop()
	if m := chargedRE.FindStringSubmatch(g.stderr()); m == nil || m[1] == "0" {
		t.Errorf("the restart charged no window (%v); stderr:\n%s", m, g.stderr())
	}
	used := func(device string) (day, short int) {
		code, st := g.call(t, "GET", "/api/v1/devices/"+device, "")
		ws, _ := st["quota"].(map[string]any)["windows"].([]any)
		if code != 200 || len(ws) != 2 {
			t.Fatalf("GET %s: %d %v", device, code, st)
		}
		return int(ws[0].(map[string]any)["used"].(float64)), int(ws[1].(map[string]any)["used"].(float64))
	}
	day, short := used("meter-1")
	t.Logf("after kill -9: meter-1 used %d of 1000 today and %d of 10 in 10 s (sent 3)", day, short)
	if day < 3 || day > 3+100 || short < 3 || short > 3+1 {
		t.Errorf("meter-1 used %d/1000 and %d/10 after the crash: want what it sent (3) and at most a lease more (100, 1)", day, short)
	}
	if day, short := used("meter-idle"); day != 3 || short > 3 {
		t.Errorf("meter-idle used %d/1000 and %d/10 after the crash, want 3: an idle device is charged nothing", day, short)
	}
	if day, short := used("meter-2"); day != 0 || short != 0 {
		t.Errorf("meter-2, never seen, used %d/1000 and %d/10 after the crash, want 0", day, short)
	}
	if day, short := used("meter-quiet"); day != 0 || short != 0 {
		t.Errorf("meter-quiet, connected long before the crash and silent, used %d/1000 and %d/10 after it, want 0", day, short)
	}
	day, short = used("meter-new")
	t.Logf("after kill -9: meter-new, connected just before it and silent, used %d of 1000 today and %d of 10 in 10 s", day, short)
	if day > 100 || short > 1 {
		t.Errorf("meter-new used %d/1000 and %d/10 after the crash: want at most its connect's lease (100, 1)", day, short)
	}
	for _, device := range []string{"meter-1", "meter-idle", "meter-2", "meter-quiet", "meter-new"} {
		dial5(t, g.mqtt, device).mustPublish(t, "devices/"+device, "after the crash", codeSuccess)
	}
}

// TestCrashBlocksNoCalmDeviceProcess: with automatic blocking, 50
// devices of which 2 flood, and the gateway killed under that load: the
// refusals counted toward a block are not quota, so the crash charges
// them nothing, and after the restart no calm device is blocked (the
// floods' blocks, made before the crash, may stay).
func TestCrashBlocksNoCalmDeviceProcess(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	yaml := `persist: {snapshot_interval: 100ms}
limits:
  default: {limit: 20, window: 10s, block: {after: 5, within: 1m, for: 1h}}
`
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGW(t, dir, "--config", cfg)
	const devices, floods = 50, 2
	stop := make(chan struct{})
	done := make(chan struct{}, devices)
	for i := range devices {
		c := dial5(t, g.mqtt, fmt.Sprintf("dev-%02d", i))
		go func() {
			defer func() { done <- struct{}{} }()
			every := 600 * time.Millisecond // 17 per 10 s: under the quota
			if i < floods {
				every = time.Millisecond
			}
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				if _, err := c.publish(fmt.Sprintf("devices/dev-%02d", i), "x"); err != nil {
					return // killed, or blocked and disconnected
				}
			}
		}()
	}
	// Under load: the floods blocked, the calm devices publishing.
	for range floods {
		g.waitLine(blockedRE, 10*time.Second)
	}
	g.kill()
	close(stop)
	for range devices {
		<-done
	}

	g = startGW(t, dir, "--config", cfg)
	defer g.stop()
	blocked := 0
	for i := floods; i < devices; i++ {
		device := fmt.Sprintf("dev-%02d", i)
		if code, st := g.call(t, "GET", "/api/v1/devices/"+device, ""); code != 200 || st["blocked_until"] != nil {
			t.Errorf("%s after the crash: %d %v", device, code, st)
			blocked++
			continue
		}
		c := dial5(t, g.mqtt, device)
		for range 3 {
			if code, err := c.publish("devices/"+device, "after"); err != nil || code != codeSuccess {
				t.Errorf("%s after the crash: PUBACK 0x%02x, %v", device, code, err)
			}
		}
		c.close()
	}
	t.Logf("after kill -9 under load: %d of %d calm devices blocked", blocked, devices-floods)
}

// TestClusterTakesNoConnectLeaseProcess: a gateway deciding in Redis,
// or as its devices' owner, takes no lease at a device's connect (nor
// when its publishes are decided there): what a crash of it costs is
// cluster.lease_share's, in Redis (docs/durability.md, "Cluster mode").
// A standalone gateway, the control, writes the connect's lease before
// the CONNACK.
func TestClusterTakesNoConnectLeaseProcess(t *testing.T) {
	srv, ownerSrv := redistest.Start(t), redistest.Start(t) // one mode per redis
	records := func(g *gw) float64 {
		samples, _ := g.scrape(t)
		return samples["devicegate_lease_records_total"]
	}
	for _, tc := range []struct {
		name  string
		start func() *gw
		want  func(float64) bool
	}{
		{"standalone", func() *gw { return startGW(t, t.TempDir(), "--limit", "5", "--window", "10s") }, func(n float64) bool { return n >= 1 }},
		{"decisions in redis", func() *gw {
			return startClusterGW(t, clusterConfig(t, srv, "local"), "--limit", "5", "--window", "10s")
		}, func(n float64) bool { return n == 0 }},
		{"owner", func() *gw { return startOwnerGW(t, ownerConfig(t, ownerSrv), "--limit", "5", "--window", "10s") }, func(n float64) bool { return n == 0 }},
	} {
		g := tc.start()
		c := dial5(t, g.mqtt, "meter-"+strings.ReplaceAll(tc.name, " ", "-"))
		c.mustPublish(t, "devices/meter", "reading", codeSuccess)
		if n := records(g); !tc.want(n) {
			t.Errorf("%s: %v lease records written after a connect and a publish", tc.name, n)
		}
		c.close()
		g.stop()
	}
}
