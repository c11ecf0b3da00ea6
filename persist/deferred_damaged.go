package persist

import (
	"bytes"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// bucketDeferredDamaged holds the deferred messages set aside as
// damaged (SetAsideDeferred): under the key and with the record they
// had, never released.
var bucketDeferredDamaged = []byte("deferred-damaged")

// SetAsideDeferred moves the deferred messages keys names from the
// deferral queue to the damaged ones, durably, in one transaction: each
// is then in one or the other, never in both nor in neither. Keys not
// stored are not an error. held is how many damaged messages the file
// holds after the move, these and those set aside before; with no keys
// nothing is written, and held is counted.
func (s *Store) SetAsideDeferred(keys []DeferredKey) (held int, err error) {
	write := s.update
	if len(keys) == 0 {
		// Only the count: no write at start-up, where the disk may be
		// full.
		write = s.view
	}
	err = write(func(tx *bolt.Tx) error {
		if len(keys) == 0 {
			if b := tx.Bucket(bucketDeferredDamaged); b != nil {
				held = b.Stats().KeyN
			}
			return nil
		}
		aside, err := tx.CreateBucketIfNotExists(bucketDeferredDamaged)
		if err != nil {
			return err
		}
		if q := tx.Bucket(bucketDeferred); q != nil {
			for _, key := range keys {
				if validDeferredDevice(key.Device) != nil {
					continue // never stored
				}
				// Fresh for each: bbolt keeps what Put is given until
				// the commit.
				k := appendDeferredKey(nil, key.Device, key.Seq)
				v := q.Get(k)
				if v == nil {
					continue
				}
				if err := aside.Put(k, bytes.Clone(v)); err != nil {
					return err
				}
				if err := q.Delete(k); err != nil {
					return err
				}
			}
		}
		// Counted by a walk: Stats reads committed pages only, not
		// this transaction's writes.
		held = 0
		return aside.ForEach(func(_, _ []byte) error { held++; return nil })
	})
	if err != nil {
		return 0, fmt.Errorf("set %d damaged deferred messages aside in %q: %w", len(keys), s.path, err)
	}
	return held, nil
}

// DamagedDeferred calls fn for every deferred message set aside as
// damaged, in key order (grouped by device, in increasing seq); rec is
// valid only during the call.
func (s *Store) DamagedDeferred(fn func(device string, seq uint64, rec []byte)) error {
	err := s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketDeferredDamaged)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			dev, seq, err := decodeDeferredKey(k)
			if err != nil {
				return fmt.Errorf("damaged deferred key %s: %w", keyName(k), err)
			}
			fn(string(dev), seq, v)
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("read the damaged deferred messages in %q: %w", s.path, err)
	}
	return nil
}
