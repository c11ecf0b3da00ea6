package persist

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
)

// restoreBatch is how many windows a restore worker takes at a time.
const restoreBatch = 512

// RestoreWindows loads every stored window into t and returns how many
// it read. Call it at start-up, on an empty table, before decisions
// start: it uses every CPU (one goroutine reads the file, GOMAXPROCS
// goroutines fill the table). A record that does not decode stops the
// restore with an error wrapping ErrCorrupt that names the file and the
// device: a damaged file is never skipped silently. The windows of
// device IDs too long to be keys are read from their own bucket (see
// longKey) like the others.
func (s *Store) RestoreWindows(t *devicelimit.Table) (int, error) {
	var n atomic.Int64
	err := s.view(func(tx *bolt.Tx) error {
		// The keys and values point into the memory map, valid while
		// the transaction is: the workers are done before it ends.
		type kv struct{ k, v []byte }
		var (
			jobs    = make(chan []kv, 4)
			wg      sync.WaitGroup
			failed  atomic.Bool
			errOnce sync.Once
			werr    error
		)
		fail := func(err error) {
			errOnce.Do(func() { werr = err })
			failed.Store(true)
		}
		for range runtime.GOMAXPROCS(0) {
			wg.Go(func() {
				for batch := range jobs {
					if failed.Load() {
						continue // drain, so the reader never blocks
					}
					err := guard(func() error {
						for _, e := range batch {
							if err := t.RestoreBinary(string(e.k), e.v); err != nil {
								return fmt.Errorf("%w: device %s: %w", ErrCorrupt, keyName(e.k), err)
							}
						}
						return nil
					})
					if err != nil {
						fail(err)
						continue
					}
					n.Add(int64(len(batch)))
				}
			})
		}
		read := func() error {
			defer func() {
				close(jobs)
				wg.Wait()
			}()
			batch := make([]kv, 0, restoreBatch)
			b := tx.Bucket(bucketWindows)
			long := tx.Bucket(bucketWindowsLong)
			keys := b.Stats().KeyN
			if long != nil {
				keys += long.Stats().KeyN
			}
			t.Grow(keys)
			c := b.Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				if v == nil {
					return fmt.Errorf("%w: device %s: a bucket, not a window", ErrCorrupt, keyName(k))
				}
				batch = append(batch, kv{k, v})
				if len(batch) == restoreBatch {
					if failed.Load() {
						return nil
					}
					jobs <- batch
					batch = make([]kv, 0, restoreBatch)
				}
			}
			if long != nil {
				c := long.Cursor()
				for k, v := c.First(); k != nil; k, v = c.Next() {
					device, enc, err := decodeLongValue(k, v)
					if err != nil {
						return err
					}
					batch = append(batch, kv{device, enc})
					if len(batch) == restoreBatch {
						if failed.Load() {
							return nil
						}
						jobs <- batch
						batch = make([]kv, 0, restoreBatch)
					}
				}
			}
			if len(batch) > 0 {
				jobs <- batch
			}
			return nil
		}
		if err := read(); err != nil {
			return err
		}
		return werr
	})
	if err != nil {
		return int(n.Load()), fmt.Errorf("restore windows from %q: %w", s.path, err)
	}
	return int(n.Load()), nil
}
