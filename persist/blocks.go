package persist

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
)

// bucketBlocks holds the devices blocked by automatic blocking: the
// device ID as key (IDs too long for a bbolt key are not blocked
// durably), the block's end as 8 bytes big-endian. Made on the first
// block: data files without blocks have no such bucket.
var bucketBlocks = []byte("blocks")

// SetBlock stores device's block until until.
func (s *Store) SetBlock(device string, until devicelimit.Tick) error {
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
		return b.Put([]byte(device), binary.BigEndian.AppendUint64(nil, uint64(until)))
	})
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

// LoadBlocks calls fn for every stored block; device is valid only
// during the call.
func (s *Store) LoadBlocks(fn func(device string, until devicelimit.Tick) error) error {
	return s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketBlocks)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			if len(v) != 8 || len(k) == 0 {
				return fmt.Errorf("%w: block of %s: a record of %d bytes, want 8", ErrCorrupt, keyName(k), len(v))
			}
			return fn(string(k), devicelimit.Tick(binary.BigEndian.Uint64(v)))
		})
	})
}
