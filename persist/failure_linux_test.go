//go:build linux

package persist

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// limitFileSize makes writes beyond offset size of any file of the
// process fail with EFBIG (RLIMIT_FSIZE; Go ignores the SIGXFSZ that
// comes with them), until the returned function restores the limit.
// Tests using it must not run in parallel.
func limitFileSize(t *testing.T, size int64) (restore func()) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Skipf("getrlimit: %v", err)
	}
	lim := old
	lim.Cur = uint64(size)
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Skipf("setrlimit: %v", err)
	}
	done := false
	restore = func() {
		if !done {
			done = true
			if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
				t.Fatalf("restore RLIMIT_FSIZE: %v", err)
			}
		}
	}
	t.Cleanup(restore)
	return restore
}

// TestSnapshotRetriesAfterWriteFailure makes writes to the data file's
// pages fail with an I/O error (as a failing or full disk would), so
// snapshots fail; the collected windows must be kept and written once
// the disk works again, with changes made meanwhile winning over the
// kept ones.
func TestSnapshotRetriesAfterWriteFailure(t *testing.T) {
	var logs logBuffer
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tab := newTable(t, 10)
	clock := devicelimit.NewManualClock(t0)
	sn := NewSnapshotter(s, tab, clock, time.Second, newLogger(&logs))
	tab.AllowAt("a", q, t0)
	tab.AllowAt("gone", q, t0)
	if _, err := sn.Snapshot(); err != nil {
		t.Fatal(err)
	}
	before := fileBytes(t, s.Path())
	// Only the two meta pages, at the start of the file, stay writable:
	// no transaction can write its pages, so none reaches its meta page.
	restore := limitFileSize(t, 2*4096)

	const n = 5000
	for i := range n {
		tab.AllowAt(fmt.Sprintf("device-%05d", i), q, clock.Now())
	}
	tab.AllowAt("a", q, clock.Now())
	tab.AllowAt("b", q, clock.Now())
	tab.Reset("gone")
	sn.tick()
	if sn.pending() == 0 {
		t.Fatalf("the failed batch was dropped; log:\n%s", logs.String())
	}
	// Meanwhile, newer changes of windows in the failed batch.
	clock.Advance(100 * ms)
	tab.AllowAt("a", q, clock.Now())
	tab.Reset("b")
	sn.tick()
	sn.tick()
	if got := logs.count("level=ERROR", "snapshot failed"); got != 1 {
		t.Fatalf("%d error lines for one failure streak, want 1:\n%s", got, logs.String())
	}
	if !bytes.Equal(fileBytes(t, s.Path())[:2*4096], before[:2*4096]) {
		t.Fatal("a failed snapshot changed the meta pages")
	}
	if h := s.Health(); !h.Failing || h.Failures != 3 || h.Since.IsZero() || !strings.Contains(h.Err, "file too large") {
		t.Fatalf("health while snapshots fail: %+v, want failing with 3 failures and the cause", h)
	}

	restore()
	sn.tick()
	if h := s.Health(); h.Failing || h.Failures != 3 || !h.Since.IsZero() || h.Err != "" {
		t.Fatalf("health after a snapshot succeeded again: %+v, want healthy (3 failures counted)", h)
	}
	if got := logs.count("level=INFO", "snapshot written after failures", "failures=3"); got != 1 {
		t.Fatalf("want one line ending the streak:\n%s", logs.String())
	}
	if sn.pending() != 0 {
		t.Fatalf("%d entries still pending", sn.pending())
	}
	got := stored(t, s)
	if len(got) != n+1 {
		t.Fatalf("%d windows stored, want %d", len(got), n+1)
	}
	for _, d := range []string{"gone", "b"} {
		if _, ok := got[d]; ok {
			t.Fatalf("%s was deleted but is stored", d)
		}
	}
	w, _ := tab.Snapshot("a")
	if want, _ := w.MarshalBinary(); string(got["a"]) != string(want) {
		t.Fatalf("a: stored % x, want the newest % x", got["a"], want)
	}
	if w.Total() != 3 {
		t.Fatalf("a has %d counts, want 3", w.Total())
	}
	t.Logf("log:\n%s", logs.String())
}

// TestEnqueueWriteFailure makes the data file unwritable: enqueues fail,
// store nothing, and the store takes enqueues again once the disk works.
func TestEnqueueWriteFailure(t *testing.T) {
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Enqueue("d", 0, []byte("kept")); err != nil {
		t.Fatal(err)
	}
	restore := limitFileSize(t, 2*4096)
	const n = 10
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- s.Enqueue("d", uint64(1+i), []byte("lost")) }()
	}
	for range n {
		if err := <-errs; err == nil || !strings.Contains(err.Error(), s.Path()) {
			t.Fatalf("enqueue to an unwritable file: got %v, want an error naming the file", err)
		}
	}
	if err := s.DeleteDeferred([]DeferredKey{{"d", 0}}); err == nil {
		t.Fatal("delete from an unwritable file succeeded")
	}
	if h := s.Health(); !h.Failing || h.Failures == 0 {
		t.Fatalf("health after failed enqueues: %+v, want failing", h)
	}
	restore()
	if got := loadAll(t, s); len(got) != 1 || got[0] != (message{"d", 0, "kept"}) {
		t.Fatalf("after failed writes: %v, want only the first message", got)
	}
	if err := s.Enqueue("d", 1, []byte("r")); err != nil {
		t.Fatalf("enqueue after the disk recovered: %v", err)
	}
	if h := s.Health(); h.Failing {
		t.Fatalf("health after a successful enqueue: %+v, want healthy", h)
	}
	if got, _, _ := s.DeferredStats(); got != 2 {
		t.Fatalf("%d messages, want 2", got)
	}
}

// TestHealthFailingUntilAnAppendFits: on a full disk (the file may not
// grow: RLIMIT_FSIZE at its size) an append that needs new pages fails
// while a small one still fits in the file's free pages. The small
// success must not report the store healthy (before, /healthz answered
// 200 for 81-84 % of a full-disk outage): only a write as large as the
// smallest that failed does.
func TestHealthFailingUntilAnAppendFits(t *testing.T) {
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Free pages in the file: records written, then deleted.
	var seqs []uint64
	for i := range 200 {
		seqs = append(seqs, uint64(i+1))
		if err := s.AppendForward("up/0", uint64(i+1), make([]byte, 1024)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteForward("up/0", seqs); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	restore := limitFileSize(t, info.Size())
	big := make([]byte, info.Size()+1<<20) // more than the file's free pages hold
	if err := s.AppendForward("up/0", 1000, big); err == nil {
		t.Fatalf("a %d-byte append to a file of %d bytes that may not grow succeeded", len(big), info.Size())
	}
	if h := s.Health(); !h.Failing {
		t.Fatalf("after a failed append: %+v, want failing", h)
	}
	if err := s.AppendForward("up/0", 1001, []byte("small")); err != nil {
		t.Fatalf("a small append into free pages: %v", err)
	}
	if err := s.DeleteForward("up/0", []uint64{1001}); err != nil {
		t.Fatalf("a deletion: %v", err)
	}
	if h := s.Health(); !h.Failing {
		t.Fatalf("after a small append and a deletion succeeded while large appends fail: %+v, want failing still", h)
	}
	restore()
	if err := s.AppendForward("up/0", 1002, big); err != nil {
		t.Fatal(err)
	}
	if h := s.Health(); h.Failing {
		t.Fatalf("after the large append succeeded: %+v, want healthy", h)
	}
}
