//go:build linux

package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPersistFailureShowsInHealthProcess: while the gateway cannot write
// its data file, /healthz answers 503 naming the file and the cause, the
// metric devicegate_persist_failing is 1, and the log says so once; when
// writes succeed again, all three say so. The failing disk is a file-size
// limit (RLIMIT_FSIZE) set on the running gateway: every page write past
// the two meta pages fails with EFBIG, as a full or failing disk would.
func TestPersistFailureShowsInHealthProcess(t *testing.T) {
	dir := t.TempDir()
	g := startGW(t, dir)
	pid := g.cmd.Process.Pid
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_FSIZE, nil, &old); err != nil {
		t.Fatalf("prlimit: %v", err)
	}
	if err := unix.Prlimit(pid, unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: 2 * 4096, Max: old.Max}, nil); err != nil {
		t.Fatalf("prlimit: %v", err)
	}

	if code, m := g.call(t, "PUT", "/api/v1/devices/meter-1/quota", `{"limit":5,"window":"10s"}`); code != 500 {
		t.Fatalf("PUT quota on an unwritable file: %d %v, want 500", code, m)
	}
	file := filepath.Join(dir, "devicegate.db")
	code, body := g.raw(t, "", "GET", "/healthz", "")
	if code != 503 || !strings.Contains(string(body), `"status":"unhealthy"`) || !strings.Contains(string(body), file) ||
		!strings.Contains(string(body), "file too large") {
		t.Fatalf("healthz while writes fail: %d %s, want 503 naming %s and the cause", code, body, file)
	}
	if _, m := g.raw(t, "", "GET", "/metrics", ""); !strings.Contains(string(m), "\ndevicegate_persist_failing 1\n") {
		t.Fatalf("metrics while writes fail lack devicegate_persist_failing 1")
	}
	g.waitLine(regexp.MustCompile(regexp.QuoteMeta(`level=ERROR msg="data file writes failing`)), 10*time.Second)

	if err := unix.Prlimit(pid, unix.RLIMIT_FSIZE, &old, nil); err != nil {
		t.Fatalf("prlimit: %v", err)
	}
	if code, m := g.call(t, "PUT", "/api/v1/devices/meter-1/quota", `{"limit":5,"window":"10s"}`); code != 200 {
		t.Fatalf("PUT quota after the disk recovered: %d %v", code, m)
	}
	if code, body := g.raw(t, "", "GET", "/healthz", ""); code != 200 {
		t.Fatalf("healthz after the disk recovered: %d %s", code, body)
	}
	_, m := g.raw(t, "", "GET", "/metrics", "")
	if !strings.Contains(string(m), "\ndevicegate_persist_failing 0\n") || !strings.Contains(string(m), "\ndevicegate_persist_write_failures_total 1\n") {
		t.Fatalf("metrics after recovery: want devicegate_persist_failing 0 and 1 failed write:\n%s", m)
	}
	g.waitLine(regexp.MustCompile(regexp.QuoteMeta(`level=INFO msg="data file writes succeed again"`)), 10*time.Second)
	g.stop()
	if n := strings.Count(g.stderr(), "data file writes failing"); n != 1 {
		t.Fatalf("%d lines for one failing streak, want 1", n)
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatal(err)
	}
}
