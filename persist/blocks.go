package persist

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
)

// bucketBlocks holds the devices blocked by automatic blocking, the
// device ID as key (IDs too long for a bbolt key are not blocked
// durably). A record is version 1: the block's end, 8 bytes big-endian
// (written by gateways that kept no start or reason; still read); or
// version 2: the byte 2, the end and the start (8 bytes big-endian
// each), then the reason (UTF-8, the rest of the record). Made on the
// first block: data files without blocks have no such bucket.
var bucketBlocks = []byte("blocks")

// blockRecordV2 is the version byte of a block record with its start
// and reason; a version 1 record is 8 bytes and has none.
const blockRecordV2 = 2

// maxBlockReason bounds a stored reason (the gateway's are far
// shorter): a longer one is cut at a rune boundary.
const maxBlockReason = 1024

// SetBlock stores device's block from since until until, for reason.
func (s *Store) SetBlock(device string, since, until devicelimit.Tick, reason string) error {
	if err := devicelimit.ValidDeviceID(device); err != nil {
		return err
	}
	if longID(device) {
		return fmt.Errorf("%w: an ID of %d bytes is too long to block durably", devicelimit.ErrInvalidDevice, len(device))
	}
	return s.update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketBlocks)
		if err != nil {
			return err
		}
		return b.Put([]byte(device), encodeBlock(since, until, reason))
	})
}

// encodeBlock is a version 2 block record.
func encodeBlock(since, until devicelimit.Tick, reason string) []byte {
	if len(reason) > maxBlockReason {
		n := maxBlockReason
		for n > 0 && !utf8.RuneStart(reason[n]) {
			n--
		}
		reason = reason[:n]
	}
	v := make([]byte, 0, 17+len(reason))
	v = append(v, blockRecordV2)
	v = binary.BigEndian.AppendUint64(v, uint64(until))
	v = binary.BigEndian.AppendUint64(v, uint64(since))
	return append(v, reason...)
}

// decodeBlock reads a block record of either version.
func decodeBlock(v []byte) (since, until devicelimit.Tick, reason string, err error) {
	switch {
	case len(v) == 8:
		return 0, devicelimit.Tick(binary.BigEndian.Uint64(v)), "", nil
	case len(v) >= 17 && v[0] == blockRecordV2:
		if !utf8.Valid(v[17:]) {
			return 0, 0, "", fmt.Errorf("a reason that is not UTF-8")
		}
		return devicelimit.Tick(binary.BigEndian.Uint64(v[9:17])), devicelimit.Tick(binary.BigEndian.Uint64(v[1:9])), string(v[17:]), nil
	case len(v) >= 17:
		return 0, 0, "", fmt.Errorf("record version %d, want 2", v[0])
	}
	return 0, 0, "", fmt.Errorf("a record of %d bytes, want 8 or at least 17", len(v))
}

// DeleteBlock removes device's block; a missing one is not an error.
func (s *Store) DeleteBlock(device string) error {
	return s.update(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketBlocks); b != nil {
			return b.Delete([]byte(device))
		}
		return nil
	})
}

// LoadBlocks calls fn for every stored block; device and reason are
// valid only during the call. A block stored without a start and a
// reason (version 1) has since 0 and reason "".
func (s *Store) LoadBlocks(fn func(device string, since, until devicelimit.Tick, reason string) error) error {
	return s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketBlocks)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			if len(k) == 0 {
				return fmt.Errorf("%w: a block with an empty device ID", ErrCorrupt)
			}
			since, until, reason, err := decodeBlock(v)
			if err != nil {
				return fmt.Errorf("%w: block of %s: %v", ErrCorrupt, keyName(k), err)
			}
			return fn(string(k), since, until, reason)
		})
	})
}
