package main

import (
	"bytes"
	bin "encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/devicegate/devicegate/persist"
	"github.com/devicegate/devicegate/server"
)

// The process tests of persistence: real gateway processes, each with its
// own data directory, stopped with SIGTERM or killed with SIGKILL and
// started again on the same directory. They wait for log lines, never
// for time to pass; the gateway runs with debug logging so that the
// snapshotter's "snapshot written" line shows when state is on disk.

var (
	snapshotRE  = regexp.MustCompile(`level=DEBUG msg="snapshot written" windows=(\d+)`)
	restoredRE  = regexp.MustCompile(`level=INFO msg="state restored" windows=(\d+) overrides=(\d+)`)
	throttledRE = regexp.MustCompile(`msg="device throttled" device=(\S+)`)
	stoppedRE   = regexp.MustCompile(`level=INFO msg=stopped took=(\S+)`)
)

const uncleanMsg = "the previous run did not shut down cleanly"

// startOn runs a gateway on 127.0.0.1:0 with dataDir and debug logging,
// plus args, and returns it once it listens, with its MQTT address and
// the windows it restored.
func startOn(t *testing.T, dataDir string, args ...string) (p *process, addr string, windows string) {
	t.Helper()
	p = start(t, append([]string{"serve", "--mqtt-addr", "127.0.0.1:0", "--data-dir", dataDir, "--log-level", "debug"}, args...)...)
	windows = p.waitLine(restoredRE, 10*time.Second)[1]
	addr = p.waitLine(listeningRE, 10*time.Second)[1]
	return p, addr, windows
}

// stop sends SIGTERM and checks that the gateway exits 0 within the
// shutdown timeout; it returns how long that took.
func (p *process) stop() time.Duration {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatal(err)
	}
	code, took := p.wait(server.ShutdownTimeout + 2*time.Second)
	if code != 0 || took > server.ShutdownTimeout {
		p.t.Fatalf("after SIGTERM: exit %d in %s, want 0 within %s; stderr:\n%s", code, took, server.ShutdownTimeout, p.stderr())
	}
	return took
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *process) kill() {
	p.t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		p.t.Fatal(err)
	}
	p.wait(10 * time.Second)
}

// TestRestartKeepsWindowsProcess: a device that used its whole quota is
// still refused after a graceful restart, and the restart logs what it
// restored.
func TestRestartKeepsWindowsProcess(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--limit", "3", "--window", "1h"}
	p, addr, windows := startOn(t, dir, args...)
	if windows != "0" {
		t.Errorf("first start restored %s windows, want 0", windows)
	}
	c := dial5(t, addr, "meter-1")
	for i := range 3 {
		c.mustPublish(t, "devices/meter-1", fmt.Sprint("reading ", i), codeSuccess)
	}
	took := p.stop()
	m := stoppedRE.FindStringSubmatch(p.stderr())
	if m == nil {
		t.Fatalf("no %s line after SIGTERM; stderr:\n%s", stoppedRE, p.stderr())
	}
	t.Logf("graceful shutdown: %s from SIGTERM to exit (the gateway logged took=%s)", took, m[1])

	p2, addr2, windows := startOn(t, dir, args...)
	if windows != "1" {
		t.Errorf("restart restored %s windows, want 1; stderr:\n%s", windows, p2.stderr())
	}
	c2 := dial5(t, addr2, "meter-1")
	c2.mustPublish(t, "devices/meter-1", "after restart", codeQuotaExceeded)
	dial5(t, addr2, "meter-2").mustPublish(t, "devices/meter-2", "another device", codeSuccess)
	if strings.Contains(p2.stderr(), uncleanMsg) {
		t.Errorf("restart after a graceful shutdown warned of an unclean one:\n%s", p2.stderr())
	}
	p2.stop()
}

// TestKillAfterSnapshotProcess: once a snapshot has been written after a
// device's last admission, kill -9 loses nothing: the device is still
// refused after the restart, which warns of the unclean shutdown.
func TestKillAfterSnapshotProcess(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--limit", "3", "--window", "1h", "--snapshot-interval", "100ms"}
	p, addr, _ := startOn(t, dir, args...)
	c := dial5(t, addr, "meter-1")
	for i := range 3 {
		c.mustPublish(t, "devices/meter-1", fmt.Sprint("reading ", i), codeSuccess)
	}
	c.mustPublish(t, "devices/meter-1", "over", codeQuotaExceeded)
	waitSnapshotAfterThrottle(t, p, addr)
	p.kill()

	p2, addr2, windows := startOn(t, dir, args...)
	if windows == "0" {
		t.Errorf("restart after kill -9 restored no windows; stderr:\n%s", p2.stderr())
	}
	dial5(t, addr2, "meter-1").mustPublish(t, "devices/meter-1", "after kill", codeQuotaExceeded)
	if !strings.Contains(p2.stderr(), uncleanMsg) {
		t.Errorf("restart after kill -9 did not warn %q:\n%s", uncleanMsg, p2.stderr())
	}
	p2.stop()
}

// waitSnapshotAfterThrottle returns once a snapshot written after the
// throttled device's last admission is on disk. The "device throttled"
// line comes after that admission; the first snapshot line after it may
// belong to a snapshot whose windows were collected before it, but the
// next one cannot. A marker device's publish makes sure there is a next
// one: the snapshotter writes only when something changed.
func waitSnapshotAfterThrottle(t *testing.T, p *process, addr string) {
	t.Helper()
	p.waitLine(throttledRE, 10*time.Second)
	p.waitLine(snapshotRE, 10*time.Second)
	dial5(t, addr, "marker").mustPublish(t, "devices/marker", "marker", codeSuccess)
	p.waitLine(snapshotRE, 10*time.Second)
}

// TestKillLossBoundProcess checks the stated bound on what kill -9 can
// lose: one device publishes QoS 1 every 50 ms against 20 messages per
// 3 s, the gateway is killed at a random moment in the first 2 s and
// restarted on the same data directory, and the device goes on for 4 s.
// With K the largest number of admissions the client saw in any
// snapshot interval (+100 ms for the snapshot's own time and the kill),
// no interval of length T may hold more than N + K admissions. Without
// persistence up to 2N could. Timestamps are taken on the client when
// the PUBACK arrives, so intervals are counted 50 ms short of T.
func TestKillLossBoundProcess(t *testing.T) {
	const (
		limit     = 20
		window    = 3 * time.Second
		interval  = 200 * time.Millisecond
		every     = 50 * time.Millisecond
		slack     = 100 * time.Millisecond
		tolerance = 50 * time.Millisecond
	)
	dir := t.TempDir()
	args := []string{"--limit", fmt.Sprint(limit), "--window", window.String(), "--snapshot-interval", interval.String()}

	p, addr, _ := startOn(t, dir, args...)
	c := dial5(t, addr, "meter-1")
	killAfter := time.Duration(rand.Int64N(int64(2 * time.Second)))
	killed := make(chan struct{})
	timer := time.AfterFunc(killAfter, func() {
		p.cmd.Process.Kill()
		close(killed)
	})
	defer timer.Stop()
	before := publishEvery(t, c, every, killed)
	p.wait(10 * time.Second)

	p2, addr2, windows := startOn(t, dir, args...)
	c2 := dial5(t, addr2, "meter-1")
	enough := make(chan struct{})
	time.AfterFunc(4*time.Second, func() { close(enough) })
	after := publishEvery(t, c2, every, enough)
	p2.stop()

	k := maxIn(before, interval+slack)
	all := append(append([]time.Time(nil), before...), after...)
	most := maxIn(all, window-tolerance)
	t.Logf("killed %s after connecting; %d admissions before, %d after (restored %s windows); K = %d; most in any %s: %d, bound N+K = %d",
		killAfter.Round(time.Millisecond), len(before), len(after), windows, k, window-tolerance, most, limit+k)
	if most > limit+k {
		t.Errorf("%d admissions within %s, more than N+K = %d+%d; admissions at (ms from the first): %v",
			most, window-tolerance, limit, k, offsets(all))
	}
	if len(after) == 0 {
		t.Errorf("no admission in the %s after the restart: the device is stuck", 4*time.Second)
	}
}

// publishEvery publishes a QoS 1 message every interval until stop is
// closed, and returns when each admitted one (PUBACK 0x00) was
// acknowledged. A publish that gets no PUBACK ends the run; that must be
// because stop was closed (the gateway was killed).
func publishEvery(t *testing.T, c *client5, interval time.Duration, stop <-chan struct{}) []time.Time {
	t.Helper()
	var admitted []time.Time
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return admitted
		case <-tick.C:
		}
		code, err := c.publish("devices/meter-1", fmt.Sprint("reading ", i))
		switch {
		case err != nil:
			select {
			case <-stop:
				return admitted
			case <-time.After(5 * time.Second):
				t.Fatalf("publish %d: %v, and the gateway was not being stopped", i, err)
			}
		case code == codeSuccess:
			admitted = append(admitted, time.Now())
		case code != codeQuotaExceeded:
			t.Fatalf("publish %d: PUBACK 0x%02x, want 0x00 or 0x97", i, code)
		}
	}
}

// maxIn returns the largest number of times (sorted) within any closed
// interval of length d.
func maxIn(times []time.Time, d time.Duration) int {
	most, j := 0, 0
	for i := range times {
		for times[i].Sub(times[j]) > d {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}

func offsets(times []time.Time) []int64 {
	out := make([]int64, len(times))
	for i, ts := range times {
		out[i] = ts.Sub(times[0]).Milliseconds()
	}
	return out
}

// TestSecondGatewayProcess: a second gateway on a data directory in use
// exits within 2 s, non-zero, saying so, without listening; the first
// one is undisturbed.
func TestSecondGatewayProcess(t *testing.T) {
	dir := t.TempDir()
	p, addr, _ := startOn(t, dir)
	begin := time.Now()
	code, stdout, stderr := runBinary(t, "serve", "--mqtt-addr", "127.0.0.1:0", "--data-dir", dir)
	took := time.Since(begin)
	t.Logf("second gateway exited %d after %s", code, took.Round(time.Millisecond))
	want := fmt.Sprintf("gateway: data directory %q is in use by another gateway", dir)
	if code != 1 || took > 2*time.Second || !strings.HasPrefix(stderr, want) {
		t.Fatalf("second gateway: exit %d after %s, stderr %q; want 1 within 2s and %q", code, took, stderr, want)
	}
	if stdout != "" || strings.Contains(stderr, "mqtt listening") {
		t.Errorf("second gateway started or printed to stdout: %q / %q", stdout, stderr)
	}
	dial5(t, addr, "meter-1").mustPublish(t, "devices/meter-1", "still served", codeSuccess)
	p.stop()
}

// TestBadDataFileProcess: a data file that is not a store stops start-up
// with a message naming the file, and is left exactly as it was.
func TestBadDataFileProcess(t *testing.T) {
	tests := []struct {
		name    string
		content func(t *testing.T, dir string) []byte // nil: leave what a real run wrote
	}{
		{"garbage", func(*testing.T, string) []byte { return bytes.Repeat([]byte("not a devicegate store\n"), 3000) }},
		{"one page of garbage", func(*testing.T, string) []byte { return bytes.Repeat([]byte{0xa5}, 4096) }},
		{"truncated store", func(t *testing.T, dir string) []byte {
			// A real store cut to its first page: one meta page of two.
			p, _, _ := startOn(t, dir)
			p.stop()
			b, err := os.ReadFile(filepath.Join(dir, persist.FileName))
			if err != nil {
				t.Fatal(err)
			}
			return b[:min(len(b), 4096)]
		}},
		{"truncated to 0 bytes", func(t *testing.T, dir string) []byte {
			p, _, _ := startOn(t, dir)
			p.stop()
			return nil
		}},
		{"damaged freelist page", func(t *testing.T, dir string) []byte {
			// A store with one window, its freelist page's header
			// overwritten: bbolt opens it, and every write would fail.
			p, addr, _ := startOn(t, dir, "--window", "1h")
			dial5(t, addr, "meter-1").mustPublish(t, "devices/meter-1", "x", codeSuccess)
			p.stop()
			b, err := os.ReadFile(filepath.Join(dir, persist.FileName))
			if err != nil {
				t.Fatal(err)
			}
			page := freelistPageOf(t, b)
			copy(b[page*4096:], bytes.Repeat([]byte{0xab}, 8))
			return b
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, persist.FileName)
			content := tt.content(t, dir)
			if err := os.WriteFile(file, content, 0o600); err != nil {
				t.Fatal(err)
			}
			code, stdout, stderr := runBinary(t, "serve", "--mqtt-addr", "127.0.0.1:0", "--data-dir", dir)
			if code != 1 || !strings.HasPrefix(stderr, "gateway: ") || !strings.Contains(stderr, file) {
				t.Errorf("exit %d, stderr %q; want 1 and a message naming %s", code, stderr, file)
			}
			if stdout != "" || strings.Contains(stderr, "mqtt listening") {
				t.Errorf("gateway started or printed to stdout: %q / %q", stdout, stderr)
			}
			t.Logf("stderr: %s", stderr)
			got, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, content) {
				t.Errorf("the data file changed: %d bytes, was %d", len(got), len(content))
			}
		})
	}
}

// freelistPageOf returns the freelist page of the bbolt file b: its
// current meta page (the higher transaction ID at byte 64 of pages 0 and
// 1) names it at byte 48.
func freelistPageOf(t *testing.T, b []byte) int {
	t.Helper()
	if len(b) < 2*4096 {
		t.Fatalf("a %d-byte file has no two meta pages", len(b))
	}
	meta := b[:4096]
	if bin.LittleEndian.Uint64(b[4096+64:]) > bin.LittleEndian.Uint64(b[64:]) {
		meta = b[4096:]
	}
	return int(bin.LittleEndian.Uint64(meta[48:]))
}
