package persist

import (
	"fmt"

	bolt "go.etcd.io/bbolt"

	"devicegate/devicelimit"
)

// RestoreWindows loads every stored window into t and returns how many
// it read. Call it on an empty table before decisions start. A record
// that does not decode stops the restore with an error wrapping
// ErrCorrupt that names the file and the device: a damaged file is never
// skipped silently.
func (s *Store) RestoreWindows(t *devicelimit.Table) (int, error) {
	n := 0
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketWindows).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if v == nil {
				return fmt.Errorf("%w: device %s: a bucket, not a window", ErrCorrupt, keyName(k))
			}
			if err := t.RestoreBinary(string(k), v); err != nil {
				return fmt.Errorf("%w: device %s: %w", ErrCorrupt, keyName(k), err)
			}
			n++
		}
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("restore windows from %q: %w", s.path, err)
	}
	return n, nil
}
