package persist

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/logtest"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
)

type boltTx = bolt.Tx

const ms = time.Millisecond

// t0 is the tests' first instant.
var t0 = devicelimit.TickOf(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC))

var q = devicelimit.Quota{Limit: 5, Window: time.Second}

func newTable(t testing.TB, buckets int) *devicelimit.Table {
	t.Helper()
	tab, err := devicelimit.NewTable(buckets)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

func newResolver(t testing.TB, buckets int) *devicelimit.Resolver {
	t.Helper()
	r, err := devicelimit.NewResolver(devicelimit.Quota{Limit: 100, Window: 10 * time.Second}, nil, buckets)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func open(t testing.TB, dir string) *Store {
	t.Helper()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// copyStore copies the data file of the open store s into a new
// directory, as a crash would leave it, and returns the directory.
func copyStore(t testing.TB, s *Store) string {
	t.Helper()
	b, err := os.ReadFile(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, FileName), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// stored returns the raw windows bucket of s.
func stored(t testing.TB, s *Store) map[string][]byte {
	t.Helper()
	m := map[string][]byte{}
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketWindows).ForEach(func(k, v []byte) error {
			m[string(k)] = bytes.Clone(v)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// txID returns the id of the last committed write transaction.
func txID(t testing.TB, s *Store) int {
	t.Helper()
	id := 0
	if err := s.view(func(tx *bolt.Tx) error { id = tx.ID(); return nil }); err != nil {
		t.Fatal(err)
	}
	return id
}

// logBuffer is a concurrency-safe log sink.
type logBuffer struct{ logtest.Buffer }

// count returns the number of lines containing all of subs.
func (l *logBuffer) count(subs ...string) int {
	n := 0
	for _, line := range strings.Split(l.String(), "\n") {
		ok := line != ""
		for _, s := range subs {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			n++
		}
	}
	return n
}

func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func fileBytes(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// dataFile writes b as the data file of a new temporary directory and
// returns its path.
func dataFile(t testing.TB, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), FileName)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
