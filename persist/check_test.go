package persist

import (
	"bytes"
	"encoding/binary"
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

// TestCheckModes: a freelist entry outside the file (a write would
// allocate a page far beyond it: "writeat ...: negative offset" after
// writing the pages before it) is refused at Open in every mode, the
// whole check skipped or not, and the file is left as it was. What only
// the whole check finds, a page in use listed as free, stops Open with
// CheckAlways, and with CheckAfterCrash after an unclean shutdown, and
// passes with CheckNever (the risk docs/operations.md states).
func TestCheckModes(t *testing.T) {
	const outside, inUse = 0xABABABABABABABAB, 0
	path := writeStore(t, 1)
	// write copies the store, marks it unclean unless clean, and makes
	// its freelist page list one page: page, or (inUse) the root page of
	// the current meta page's buckets, a page in use.
	write := func(clean bool, page uint64) string {
		p := filepath.Join(t.TempDir(), FileName)
		if err := os.WriteFile(p, fileBytes(t, path), 0o600); err != nil {
			t.Fatal(err)
		}
		if !clean {
			setMeta(t, p, keyClean, encodeClean(false))
		}
		b := fileBytes(t, p)
		f := freelistPage(t, p)
		if n := binary.LittleEndian.Uint16(b[f*4096+10:]); n == 0 || n == 0xFFFF {
			t.Fatalf("freelist page %d lists %d pages: the test needs one short list", f, n)
		}
		if page == inUse {
			m0, m1 := b[:4096], b[4096:8192]
			if binary.LittleEndian.Uint64(m1[metaTxidOff:]) > binary.LittleEndian.Uint64(m0[metaTxidOff:]) {
				m0 = m1
			}
			page = binary.LittleEndian.Uint64(m0[pageHeaderSize+16:])
		}
		binary.LittleEndian.PutUint16(b[f*4096+10:], 1)
		binary.LittleEndian.PutUint64(b[f*4096+pageHeaderSize:], page)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		mode    CheckMode
		clean   bool
		page    uint64
		refused bool
	}{
		{CheckAlways, true, outside, true},
		{CheckAfterCrash, true, outside, true},
		{CheckAfterCrash, false, outside, true},
		{CheckNever, false, outside, true},
		{CheckNever, true, outside, true},
		{CheckAlways, true, inUse, true},
		{CheckAfterCrash, false, inUse, true},
		{CheckAfterCrash, true, inUse, false},
		{CheckNever, false, inUse, false},
	} {
		p := write(c.clean, c.page)
		before := fileBytes(t, p)
		s, err := Open(filepath.Dir(p), Options{Check: c.mode})
		if got := err != nil; got != c.refused {
			t.Fatalf("mode %v, clean %v, freelist entry %#x: Open error %v, want refused=%v", c.mode, c.clean, c.page, err, c.refused)
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), p) {
				t.Fatalf("mode %v: %v, want ErrCorrupt naming the file", c.mode, err)
			}
			if !bytes.Equal(fileBytes(t, p), before) {
				t.Fatalf("mode %v, clean %v, freelist entry %#x: refused, and the file changed", c.mode, c.clean, c.page)
			}
			continue
		}
		s.Close()
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
