package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/devicegate/devicegate/persist"
)

// TestBackupProcess: `gateway backup --out FILE` writes the running
// gateway's data file, with the override set through the API, and a
// gateway started on the copy has it.
func TestBackupProcess(t *testing.T) {
	g := startGW(t, t.TempDir())
	if code, body := g.call(t, "PUT", "/api/v1/devices/dev-1/quota", `{"limit": 3, "window": "1h"}`); code != 200 {
		t.Fatalf("set override: %d %v", code, body)
	}
	out := filepath.Join(t.TempDir(), "copy", persist.FileName)
	if err := os.Mkdir(filepath.Dir(out), 0o700); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runBinary(t, "backup", "--out", out, "--admin-addr", g.admin, "--data-dir", g.dir)
	if code != 0 || !strings.HasPrefix(stdout, "backup: ") || !strings.Contains(stdout, "bytes written to "+out) {
		t.Fatalf("backup: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if parts, _ := filepath.Glob(out + ".part-*"); len(parts) > 0 {
		t.Errorf("temporary files left: %v", parts)
	}
	g.stop()

	restored := startGW(t, filepath.Dir(out))
	if code, body := restored.call(t, "GET", "/api/v1/devices/dev-1", ""); code != 200 || body["source"] != "override" {
		t.Fatalf("device on the copy: %d %v; want its override", code, body)
	}
	if strings.Contains(restored.stderr(), "did not shut down cleanly") {
		t.Errorf("the copy started as after a crash:\n%s", restored.stderr())
	}
	code, _, stderr = runBinary(t, "backup", "--admin-addr", g.admin)
	if code != 2 || !strings.Contains(stderr, "--out FILE is required") {
		t.Fatalf("backup without --out: exit %d, stderr %q", code, stderr)
	}
}
