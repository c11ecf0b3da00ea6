package persist

import (
	"errors"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
)

// blockV1 is the record a gateway that kept no reason stored for a
// block ending at t0 + 1h: the end, 8 bytes big-endian.
const blockV1 = "\x18\x16\xc4\x65\x1f\xab\xd2\x00"

type loadedBlock struct {
	since, until devicelimit.Tick
	reason       string
}

func loadBlocks(t *testing.T, s *Store) map[string]loadedBlock {
	t.Helper()
	out := map[string]loadedBlock{}
	if err := s.LoadBlocks(func(device string, since, until devicelimit.Tick, reason string) error {
		out[device] = loadedBlock{since, until, reason}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestBlockRecords: a block is stored with its start, end and reason
// and read back after the file is reopened; a record of a gateway that
// kept only the end (version 1) is still read, with no start or reason;
// a damaged record is ErrCorrupt naming the device.
func TestBlockRecords(t *testing.T) {
	end := t0.Add(time.Hour)
	if got := string(encodeBlock(0, end, "")[1:9]); got != blockV1 {
		t.Fatalf("the test's version 1 record is not t0 + 1h: %q", got)
	}
	dir := t.TempDir()
	s := open(t, dir)
	reason := "3 refusals over quota within 1m0s (quota: 10 messages per 1m0s)"
	if err := s.SetBlock("meter-1", t0, end, reason); err != nil {
		t.Fatal(err)
	}
	if err := s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketBlocks).Put([]byte("old-1"), []byte(blockV1))
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	got := loadBlocks(t, s)
	want := map[string]loadedBlock{"meter-1": {t0, end, reason}, "old-1": {0, end, ""}}
	if len(got) != 2 || got["meter-1"] != want["meter-1"] || got["old-1"] != want["old-1"] {
		t.Fatalf("loaded %+v, want %+v", got, want)
	}

	// A reason too long is cut at a rune boundary.
	long := strings.Repeat("é", maxBlockReason)
	if err := s.SetBlock("meter-2", t0, end, long); err != nil {
		t.Fatal(err)
	}
	if r := loadBlocks(t, s)["meter-2"].reason; len(r) != maxBlockReason || !strings.HasPrefix(long, r) {
		t.Fatalf("a long reason stored as %d bytes, want %d, a prefix", len(r), maxBlockReason)
	}

	for _, bad := range []string{"\x02short", "\x03" + blockV1 + blockV1, "\x02" + blockV1 + blockV1 + "\xff"} {
		if err := s.update(func(tx *bolt.Tx) error { return tx.Bucket(bucketBlocks).Put([]byte("bad-1"), []byte(bad)) }); err != nil {
			t.Fatal(err)
		}
		err := s.LoadBlocks(func(string, devicelimit.Tick, devicelimit.Tick, string) error { return nil })
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "bad-1") {
			t.Fatalf("damaged record %q: %v, want ErrCorrupt naming bad-1", bad, err)
		}
	}
}
