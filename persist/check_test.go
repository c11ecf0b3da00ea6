package persist

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestDamageFoundAtOpenOrHarmless: 8 bytes overwritten in the header or
// first entries of any page of a store (a freelist page among them)
// either stop Open with ErrCorrupt naming the file, or leave a store that
// can still be written. Without the consistency check, a damaged freelist
// passed Open and every later write failed ("writeat ...: negative
// offset").
func TestDamageFoundAtOpenOrHarmless(t *testing.T) {
	path := writeStore(t, 1)
	size := usedSize(t, path)
	detected := 0
	for page := 2; page*4096 < size; page++ {
		for off := page * 4096; off < page*4096+64; off += 8 {
			b := fileBytes(t, path)
			for i := range 8 {
				b[off+i] = 0xAB
			}
			p := dataFile(t, b)
			s, err := Open(filepath.Dir(p), Options{})
			if err == nil {
				_, err = s.RestoreWindows(newTable(t, 10))
			}
			if err != nil {
				if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), p) {
					t.Fatalf("offset %d: got %v, want ErrCorrupt naming the file", off, err)
				}
				detected++
				continue
			}
			for i := range 3 {
				if err := s.SetOverride(newResolver(t, 10), fmt.Sprint("device-", i), devicelimit.Override{Quota: q}); err != nil {
					t.Fatalf("offset %d: the damage passed Open, then write %d failed: %v", off, i, err)
				}
			}
			s.Close()
		}
	}
	t.Logf("%d damaged offsets stopped Open", detected)
}

// TestCheckModes: CheckNever lets a damaged freelist through Open (the
// failure shows at the first write), CheckAfterCrash finds it only after
// an unclean shutdown.
func TestCheckModes(t *testing.T) {
	path := writeStore(t, 1)
	// write copies the store, marks it unclean unless clean, and damages
	// the first entry of its freelist page, so that a write would
	// allocate a page far beyond the file.
	write := func(clean bool) string {
		p := filepath.Join(t.TempDir(), FileName)
		if err := os.WriteFile(p, fileBytes(t, path), 0o600); err != nil {
			t.Fatal(err)
		}
		if !clean {
			setMeta(t, p, keyClean, encodeClean(false))
		}
		b := fileBytes(t, p)
		f := freelistPage(t, p)
		for i := range 8 {
			b[f*4096+pageHeaderSize+i] = 0xAB
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		mode    CheckMode
		clean   bool
		refused bool
	}{
		{CheckAlways, true, true},
		{CheckAfterCrash, true, false},
		{CheckAfterCrash, false, true},
		{CheckNever, false, false},
	} {
		p := write(c.clean)
		s, err := Open(filepath.Dir(p), Options{Check: c.mode})
		if got := err != nil; got != c.refused {
			t.Fatalf("mode %v, clean %v: Open error %v, want refused=%v", c.mode, c.clean, err, c.refused)
		}
		if err == nil {
			s.Close()
		}
	}
}

// freelistPage returns the page the current meta page names as the
// freelist (the layout is in check.go).
func freelistPage(t *testing.T, path string) int {
	t.Helper()
	b := fileBytes(t, path)
	le := func(x []byte) uint64 {
		var v uint64
		for i := 7; i >= 0; i-- {
			v = v<<8 | uint64(x[i])
		}
		return v
	}
	// The meta with the higher transaction ID is current.
	m0, m1 := b, b[4096:]
	m := m0
	if le(m1[metaTxidOff:]) > le(m0[metaTxidOff:]) {
		m = m1
	}
	return int(le(m[metaFreelistOff:]))
}

// TestCheckCostMillionWindows measures the consistency check on a file
// of 1,000,000 windows. It takes minutes to write the file, so it runs
// only with DEVICEGATE_CHECK_1M=1; docs/operations.md quotes its log.
func TestCheckCostMillionWindows(t *testing.T) {
	if os.Getenv("DEVICEGATE_CHECK_1M") == "" {
		t.Skip("set DEVICEGATE_CHECK_1M=1 to measure the check on 1,000,000 windows")
	}
	path := writeStore(t, 1_000_000)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []CheckMode{CheckNever, CheckAlways, CheckAlways} {
		// The first check reads the file from disk when the page cache
		// can be dropped (root on Linux); the second from memory.
		syscall.Sync()
		cold := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0) == nil
		start := time.Now()
		s, err := Open(filepath.Dir(path), Options{Check: mode})
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		s.Close()
		t.Logf("open with check %v: %s (check %s, page cache dropped: %v), file %d MiB, %d MiB used", mode, took, s.Meta().Checked, cold, fi.Size()>>20, usedSize(t, path)>>20)
	}
}
