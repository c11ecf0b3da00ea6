package persist

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
)

func TestOpenCreatesPrivateDirAndFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data", "gw")
	s := open(t, dir)
	if s.Path() != filepath.Join(dir, FileName) {
		t.Fatalf("path %q", s.Path())
	}
	for path, want := range map[string]fs.FileMode{dir: 0o700 | fs.ModeDir, s.Path(): 0o600} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Fatalf("%s: mode %v, want %v", path, fi.Mode(), want)
		}
	}
}

func TestOpenDataDirIsAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(path, Options{})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("data directory %q is not a directory", path)) {
		t.Fatalf("got %v, want an error saying %q is not a directory", err, path)
	}
	// And a data file that is a directory.
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, FileName), 0o700); err != nil {
		t.Fatal(err)
	}
	_, err = Open(dir, Options{})
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, FileName)) {
		t.Fatalf("got %v, want an error naming the data file", err)
	}
}

func TestOpenInUse(t *testing.T) {
	dir := t.TempDir()
	open(t, dir)
	start := time.Now()
	s, err := Open(dir, Options{})
	took := time.Since(start)
	if err == nil {
		s.Close()
		t.Fatal("second open of the same directory succeeded")
	}
	if !errors.Is(err, ErrInUse) {
		t.Fatalf("got %v, want ErrInUse", err)
	}
	want := fmt.Sprintf("data directory %q is in use by another gateway (lock on %q held)", dir, filepath.Join(dir, FileName))
	if err.Error() != want {
		t.Fatalf("message %q, want %q", err, want)
	}
	if took > 2*time.Second {
		t.Fatalf("took %v to fail, want under 2s", took)
	}
	t.Logf("second open failed after %v", took)
}

// writeStore creates a store in a new directory holding n windows and an
// override, closes it, and returns its file's path.
func writeStore(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	tab := newTable(t, 10)
	for i := range n {
		tab.AllowAt(fmt.Sprintf("device-%06d", i), q, t0)
	}
	sn := NewSnapshotter(s, tab, devicelimit.NewManualClock(t0), 0, nil)
	if err := sn.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := s.SetOverride(newResolver(t, 10), "device-000001", devicelimit.Override{Quota: q}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return s.Path()
}

// openBroken opens the directory of path, which must fail or fail to
// restore with an error wrapping want and naming path, and leave the file
// as it was.
func openBroken(t *testing.T, path string, want error) {
	t.Helper()
	before := fileBytes(t, path)
	s, err := Open(filepath.Dir(path), Options{})
	if err == nil {
		// Open reads only the meta data: the damage may be in the pages
		// a restore reads.
		_, err = s.RestoreWindows(newTable(t, 10))
		if err == nil {
			_, err = s.RestoreOverrides(newResolver(t, 10), t0)
		}
		s.Close()
	}
	if !errors.Is(err, want) || !strings.Contains(err.Error(), path) {
		t.Fatalf("got %v, want an error wrapping %v naming %s", err, want, path)
	}
	t.Logf("error: %v", err)
	if !bytes.Equal(fileBytes(t, path), before) {
		t.Fatal("the damaged file was changed")
	}
}

func TestOpenRandomBytes(t *testing.T) {
	for _, size := range []int{1, 1000, 4096, 64 << 10} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			b := make([]byte, size)
			rng := rand.New(rand.NewPCG(1, uint64(size)))
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			path := dataFile(t, b)
			openBroken(t, path, ErrCorrupt)
		})
	}
}

func TestOpenTruncated(t *testing.T) {
	path := writeStore(t, 5000)
	need := usedSize(t, path)
	for _, keep := range []int{need - 1, need - 4096, need / 2, 3 * 4096, 4096 + 100} {
		t.Run(fmt.Sprint(keep), func(t *testing.T) {
			b := fileBytes(t, path)[:keep]
			p := dataFile(t, b)
			openBroken(t, p, ErrCorrupt)
		})
	}
}

// usedSize returns the size of the pages in use in the bbolt file at
// path; the file may be longer.
func usedSize(t *testing.T, path string) int {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var size int
	db.View(func(tx *bolt.Tx) error { size = int(tx.Size()); return nil })
	return size
}

func TestOpenDamagedPages(t *testing.T) {
	path := writeStore(t, 5000)
	size := usedSize(t, path)
	rng := rand.New(rand.NewPCG(7, 7))
	failed := 0
	for page := 2; page*4096 < size; page++ {
		b := fileBytes(t, path)
		off := page * 4096
		for i := off; i < off+4096; i++ {
			b[i] = byte(rng.Uint32())
		}
		p := dataFile(t, b)
		// A damaged page the store does not read (free, or a freelist
		// page no longer in use) is harmless; one it reads must fail
		// cleanly, never crash or restore garbage silently.
		s, err := Open(filepath.Dir(p), Options{})
		if err == nil {
			_, err = s.RestoreWindows(newTable(t, 10))
			if err == nil {
				_, err = s.RestoreOverrides(newResolver(t, 10), t0)
			}
			s.Close()
		}
		if err != nil && (!errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), p)) {
			t.Fatalf("page %d: got %v, want nil or ErrCorrupt naming the file", page, err)
		}
		if err != nil {
			failed++
		}
	}
	t.Logf("%d of %d damaged pages detected", failed, size/4096-2)
	if failed == 0 {
		t.Fatal("no damage detected")
	}
}

// setMeta rewrites a meta key of a closed store with bbolt itself.
func setMeta(t *testing.T, path string, key, value []byte) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		if value == nil {
			return tx.Bucket(bucketMeta).Delete(key)
		}
		return tx.Bucket(bucketMeta).Put(key, value)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestOpenNewerSchema(t *testing.T) {
	path := writeStore(t, 10)
	setMeta(t, path, keySchema, encodeSchema(SchemaVersion+1))
	openBroken(t, path, ErrNewerSchema)
}

func TestOpenBadMeta(t *testing.T) {
	for name, kv := range map[string][2][]byte{
		"no schema":   {keySchema, nil},
		"short clock": {keyClock, {1, 2, 3}},
		"bad clean":   {keyClean, {2}},
	} {
		t.Run(name, func(t *testing.T) {
			path := writeStore(t, 10)
			setMeta(t, path, kv[0], kv[1])
			openBroken(t, path, ErrCorrupt)
		})
	}
}

func TestRestoreBadRecord(t *testing.T) {
	path := writeStore(t, 10)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketWindows).Put([]byte("device-000003"), []byte{1, 2, 3})
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, filepath.Dir(path))
	_, err = s.RestoreWindows(newTable(t, 10))
	if !errors.Is(err, ErrCorrupt) || !errors.Is(err, devicelimit.ErrBadSnapshot) ||
		!strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), `"device-000003"`) {
		t.Fatalf("got %v, want ErrCorrupt naming the file and the device", err)
	}
}

// TestOpenEmptyFile: an existing data file of 0 bytes is not a store
// (Open creates a store under a temporary name and renames it into place
// only once it is complete, so no start leaves one): Open refuses it and
// leaves it as it is, rather than lay out a fresh store in which every
// device has its whole quota again.
func TestOpenEmptyFile(t *testing.T) {
	path := dataFile(t, nil)
	openBroken(t, path, ErrCorrupt)
}

// TestOpenFileWithoutBuckets: a valid bbolt file that holds none of the
// store's buckets is not a store either.
func TestOpenFileWithoutBuckets(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	openBroken(t, path, ErrCorrupt)
}

// TestOpenLeavesNoTemporaryFile: creating a store leaves the data file
// and nothing else in the directory, and a temporary file left by a
// creation that was cut off is removed by the next one.
func TestOpenLeavesNoTemporaryFile(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, FileName+".new-123")
	if err := os.WriteFile(stale, []byte("cut off"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := open(t, dir)
	if !s.Meta().New {
		t.Fatalf("meta %+v, want new", s.Meta())
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 1 || names[0] != FileName {
		t.Fatalf("data directory holds %v, want only %s", names, FileName)
	}
}
