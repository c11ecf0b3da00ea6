package persist

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/varint"
)

// Leases (devicelimit/lease.go) live in the "leases" bucket, keyed by
// the window's key (those of device IDs too long to be keys in
// "leases-long", keyed and valued as the other long buckets are). A
// record is version 1, then as uvarints the incarnation, the cap, the
// units recorded by the last snapshot of that incarnation and the
// window's length in nanoseconds. A lease write and a snapshot each
// merge their part in: the higher incarnation wins, and within one the
// higher cap and the higher recorded count, so the record is right in
// whatever order the two kinds of transaction commit. The buckets are
// made by the first write and emptied at every start (SettleLeases).
var (
	bucketLeases     = []byte("leases")
	bucketLeasesLong = []byte("leases-long")
)

const leaseVersion = 1

// leaseRecord is one window's stored lease.
type leaseRecord struct {
	inc, cap, rec uint64
	length        time.Duration
}

func (l leaseRecord) append(b []byte) []byte {
	b = append(b, leaseVersion)
	b = binary.AppendUvarint(b, l.inc)
	b = binary.AppendUvarint(b, l.cap)
	b = binary.AppendUvarint(b, l.rec)
	return binary.AppendUvarint(b, uint64(l.length))
}

func decodeLease(v []byte) (leaseRecord, error) {
	if len(v) == 0 || v[0] != leaseVersion {
		return leaseRecord{}, fmt.Errorf("%w: lease record of unknown version", ErrCorrupt)
	}
	v = v[1:]
	var f [4]uint64
	for i := range f {
		x, n := varint.Uvarint(v)
		if n <= 0 {
			return leaseRecord{}, fmt.Errorf("%w: truncated or malformed lease record", ErrCorrupt)
		}
		f[i], v = x, v[n:]
	}
	if len(v) != 0 || f[3] > uint64(devicelimit.MaxWindow) {
		return leaseRecord{}, fmt.Errorf("%w: malformed lease record", ErrCorrupt)
	}
	return leaseRecord{inc: f[0], cap: f[1], rec: f[2], length: time.Duration(f[3])}, nil
}

// mergeLease merges a lease write (inc, cap, length) or, when mark is
// set, a snapshot's mark (inc, rec) into the record of key in tx.
func mergeLease(tx *bolt.Tx, key string, l leaseRecord, mark bool) error {
	name, k := bucketLeases, []byte(key)
	if longID(key) {
		name, k = bucketLeasesLong, longKey(key)
	}
	b, err := tx.CreateBucketIfNotExists(name)
	if err != nil {
		return err
	}
	var cur leaseRecord
	if v := b.Get(k); v != nil {
		if bytes.Equal(name, bucketLeasesLong) {
			_, enc, err := decodeLongValue(k, v)
			if err != nil {
				return err
			}
			v = enc
		}
		if cur, err = decodeLease(v); err != nil {
			return fmt.Errorf("device %s: %w", keyName([]byte(key)), err)
		}
	}
	switch {
	case cur.inc > l.inc:
		return nil
	case cur.inc < l.inc:
		cur = leaseRecord{inc: l.inc, length: l.length}
	}
	if mark {
		cur.rec = max(cur.rec, l.rec)
	} else {
		cur.cap, cur.length = max(cur.cap, l.cap), l.length
	}
	enc := cur.append(nil)
	if longID(key) {
		enc = appendLongValue(nil, key, enc)
	}
	return b.Put(k, enc)
}

// SettleLeases charges, at the start after an unclean shutdown, every
// window whose stored lease is open: cap - recorded units at tick at
// (the latest instant the crashed run could have admitted), as of now
// (devicelimit.Table.ChargeLease). Call it on a table just restored,
// before decisions start. In one transaction it then writes the charged
// windows and empties the leases, so that a crash right after cannot
// lose the charge, and the next run's leases start afresh. After a
// clean shutdown (charge false) it only empties them. It returns the
// number of windows charged.
func (s *Store) SettleLeases(t *devicelimit.Table, charge bool, at, now devicelimit.Tick) (int, error) {
	var keys []string
	if charge {
		err := s.view(func(tx *bolt.Tx) error {
			for _, name := range [][]byte{bucketLeases, bucketLeasesLong} {
				b := tx.Bucket(name)
				if b == nil {
					continue
				}
				err := b.ForEach(func(k, v []byte) error {
					key := k
					if bytes.Equal(name, bucketLeasesLong) {
						var err error
						if key, v, err = decodeLongValue(k, v); err != nil {
							return err
						}
					}
					l, err := decodeLease(v)
					if err != nil {
						return fmt.Errorf("device %s: %w", keyName(key), err)
					}
					if l.cap <= l.rec {
						return nil
					}
					if err := t.ChargeLease(string(key), l.length, int(min(l.cap-l.rec, devicelimit.MaxBytes)), at, now); err != nil {
						return fmt.Errorf("%w: device %s: %w", ErrCorrupt, keyName(key), err)
					}
					keys = append(keys, string(key))
					return nil
				})
				if err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("read leases from %q: %w", s.path, err)
		}
	}
	err := s.update(func(tx *bolt.Tx) error {
		for _, key := range keys {
			w, ok := t.Snapshot(key)
			if !ok {
				continue
			}
			enc, err := w.MarshalBinary()
			if err != nil {
				return err
			}
			if longID(key) {
				b, err := longBucket(tx, bucketWindowsLong, true)
				if err != nil {
					return err
				}
				if err := b.Put(longKey(key), appendLongValue(nil, key, enc)); err != nil {
					return err
				}
				continue
			}
			if err := tx.Bucket(bucketWindows).Put([]byte(key), enc); err != nil {
				return err
			}
		}
		for _, name := range [][]byte{bucketLeases, bucketLeasesLong} {
			if tx.Bucket(name) == nil {
				continue
			}
			if err := tx.DeleteBucket(name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("settle leases in %q: %w", s.path, err)
	}
	return len(keys), nil
}

// Leaser writes a Table's leases (devicelimit.Table.EnableLeases) as
// they are asked for: every lease asked since its last write goes in the
// next, through the store's group commit (shared with deferred
// messages), and the admissions waiting for them are let go once it is
// durable. A failed write is retried with the next batch. Create it
// with NewLeaser; safe for concurrent use.
type Leaser struct {
	store *Store
	table *devicelimit.Table
	log   *slog.Logger

	writes  sync.Mutex // guards stats
	batches uint64     // lease writes committed
	records uint64     // lease records written

	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// NewLeaser returns a Leaser of t's leases into s and starts it. log
// nil discards.
func NewLeaser(s *Store, t *devicelimit.Table, log *slog.Logger) *Leaser {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Leaser{store: s, table: t, log: log, stop: make(chan struct{}), done: make(chan struct{})}
	go l.run()
	return l
}

// retryAfter is the pause before a failed lease write is tried again.
const retryAfter = 100 * time.Millisecond

func (l *Leaser) run() {
	defer close(l.done)
	failing := false
	for {
		select {
		case <-l.stop:
			return
		case <-l.table.LeaseWake():
		}
		err := l.write()
		switch {
		case err != nil && !failing:
			failing = true
			l.log.Error("lease write failed; admissions that need a lease wait; retrying", "path", l.store.path, "err", err)
		case err == nil && failing:
			failing = false
			l.log.Info("lease written after failures", "path", l.store.path)
		}
		if err != nil {
			select {
			case <-l.stop:
				return
			case <-time.After(retryAfter):
			}
		}
	}
}

// write writes one batch of leases.
func (l *Leaser) write() error {
	type entry struct {
		key string
		l   devicelimit.Lease
	}
	var batch []entry
	gen, keys := l.table.TakeLeases(func(key string, le devicelimit.Lease) {
		batch = append(batch, entry{key, le})
	})
	if len(batch) > 0 {
		r := &request{done: make(chan error, 1), fn: func(tx *bolt.Tx) error {
			for _, e := range batch {
				if err := mergeLease(tx, e.key, leaseRecord{inc: e.l.Inc, cap: e.l.Cap, length: e.l.Length}, false); err != nil {
					return err
				}
			}
			return nil
		}}
		if err := l.store.commit.do(r); err != nil {
			l.table.RequeueLeases(keys)
			return fmt.Errorf("write %d leases to %q: %w", len(batch), l.store.path, err)
		}
	}
	l.table.LeasesDurable(gen)
	l.table.ReleaseLeaseKeys(keys)
	l.writes.Lock()
	l.batches++
	l.records += uint64(len(batch))
	l.writes.Unlock()
	return nil
}

// Stats returns how many lease writes were committed and how many
// lease records they wrote, for metrics.
func (l *Leaser) Stats() (writes, records uint64) {
	l.writes.Lock()
	defer l.writes.Unlock()
	return l.batches, l.records
}

// Close stops the Leaser, waiting for a write in progress or ctx. Call
// it before closing the store; calls after the first do nothing.
func (l *Leaser) Close(ctx context.Context) error {
	l.stopOnce.Do(func() { close(l.stop) })
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close leaser: %w", ctx.Err())
	}
}
