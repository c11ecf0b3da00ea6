package main

import (
	"bytes"
	bin "encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/devicegate/devicegate/persist"
)

// TestCheckNeverDamagedFreelistProcess: with persist.check_on_start:
// never, a damaged freelist page (its header, or an entry naming a page
// far beyond the file) still stops start-up with a message naming the
// file and the freelist, and the file is left exactly as it was (an
// earlier build started writing, failed with "writeat ...: negative
// offset" and had changed a page of the file).
func TestCheckNeverDamagedFreelistProcess(t *testing.T) {
	cfg := writeConfig(t, "persist: {check_on_start: never}\n")
	for _, damage := range []struct {
		name string
		at   int // bytes into the freelist page
	}{{"header", 0}, {"first entry", 16}} {
		t.Run(damage.name, func(t *testing.T) {
			dir := t.TempDir()
			p, addr, _ := startOn(t, dir, "--config", cfg, "--window", "1h")
			dial5(t, addr, "meter-1").mustPublish(t, "devices/meter-1", "x", codeSuccess)
			p.stop()
			file := filepath.Join(dir, persist.FileName)
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			page := freelistPageOf(t, b)
			if n := bin.LittleEndian.Uint16(b[page*4096+10:]); damage.at >= 16 && n == 0 {
				t.Fatalf("freelist page %d lists no page", page)
			}
			copy(b[page*4096+damage.at:], bytes.Repeat([]byte{0xab}, 8))
			if err := os.WriteFile(file, b, 0o600); err != nil {
				t.Fatal(err)
			}
			code, stdout, stderr := runBinary(t, "serve", "--config", cfg, "--mqtt-addr", "127.0.0.1:0", "--data-dir", dir)
			t.Logf("stderr: %s", stderr)
			if code != 1 || !strings.HasPrefix(stderr, "gateway: ") || !strings.Contains(stderr, file) || !strings.Contains(stderr, "freelist page") {
				t.Errorf("exit %d, stderr %q; want 1 and a message naming %s and its freelist", code, stderr, file)
			}
			if stdout != "" || strings.Contains(stderr, "mqtt listening") {
				t.Errorf("gateway started or printed to stdout: %q / %q", stdout, stderr)
			}
			if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, b) {
				t.Errorf("the data file changed (%v)", err)
			}
		})
	}
}
