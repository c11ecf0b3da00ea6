package persist

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
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
// record is version 1 or 2, then as uvarints the incarnation, the cap,
// the units recorded by the last snapshot of that incarnation and the
// window's length in nanoseconds; version 2 then holds the units the
// window had admitted at its latest lease write and, the rest of the
// record, its counts then (a window's encoding, devicelimit's
// Window.MarshalBinary; none when empty). A lease write (through the
// lease log, leaselog.go, when it is folded) and a snapshot each merge
// their part in: the higher incarnation wins, and within one
// the higher cap, the higher recorded count and the lease write with
// the more admissions, so the record is right in whatever order the two
// kinds of transaction commit. A snapshot writes a window's mark only
// when its lease closes (devicelimit's CollectLeases); one that deletes
// the window drops the lease write's counts (the window is gone: they
// must not bring it back) and records the whole of its leases (the
// deleted incarnation admits nothing more: its lease is closed), unless
// the record is of a later incarnation than the deleted window. A lease
// write of the deleted incarnation that commits after the deletion
// holds no more than that: its counts stay unused, its cap recorded.
// The buckets are made by the first write and emptied at every
// start (SettleLeases).
var (
	bucketLeases     = []byte("leases")
	bucketLeasesLong = []byte("leases-long")
)

const (
	leaseVersion1 = 1 // without the lease write's counts
	leaseVersion  = 2
)

// leaseRecord is one window's stored lease.
type leaseRecord struct {
	inc, cap, rec uint64
	length        time.Duration
	adm           uint64 // admitted at the latest lease write
	window        []byte // the counts then; nil: none
}

func (l leaseRecord) append(b []byte) []byte {
	b = append(b, leaseVersion)
	b = binary.AppendUvarint(b, l.inc)
	b = binary.AppendUvarint(b, l.cap)
	b = binary.AppendUvarint(b, l.rec)
	b = binary.AppendUvarint(b, uint64(l.length))
	b = binary.AppendUvarint(b, l.adm)
	return append(b, l.window...)
}

func decodeLease(v []byte) (leaseRecord, error) {
	if len(v) == 0 || (v[0] != leaseVersion && v[0] != leaseVersion1) {
		return leaseRecord{}, fmt.Errorf("%w: lease record of unknown version", ErrCorrupt)
	}
	version := v[0]
	v = v[1:]
	var f [5]uint64
	fields := f[:4]
	if version == leaseVersion {
		fields = f[:]
	}
	for i := range fields {
		x, n := varint.Uvarint(v)
		if n <= 0 {
			return leaseRecord{}, fmt.Errorf("%w: truncated or malformed lease record", ErrCorrupt)
		}
		f[i], v = x, v[n:]
	}
	if (version == leaseVersion1 && len(v) != 0) || f[3] > uint64(devicelimit.MaxWindow) {
		return leaseRecord{}, fmt.Errorf("%w: malformed lease record", ErrCorrupt)
	}
	l := leaseRecord{inc: f[0], cap: f[1], rec: f[2], length: time.Duration(f[3]), adm: f[4]}
	if len(v) > 0 {
		l.window = v // decoded (and checked) when settled: merges only copy it
	}
	return l, nil
}

// How leaseTx.merge merges a record into the stored one.
const (
	leaseWrite  = iota // a lease write: inc, cap, length, adm, window
	leaseMark          // a snapshot's mark: inc, rec
	leaseWindow        // a snapshot deleted the window of incarnation inc: drop adm and window
)

// leaseTx merges lease records in one transaction: it looks its buckets
// up once, where a tx.Bucket or CreateBucketIfNotExists per record is a
// cursor search and a Bucket allocated each, and encodes keys and
// values into one growing buffer, where bbolt keeps each Put's value
// (and the key it is given) until the commit: a lease write of
// thousands of records allocated some 15 times per record
// (BenchmarkQuietFleetLeases).
type leaseTx struct {
	tx          *bolt.Tx
	short, long *bolt.Bucket // looked up (or made) at their first use
	// A cursor per bucket for the reads: a Get makes a cursor and grows
	// its stack each call, 3 to 4 allocations; a Seek on one kept
	// reuses its stack.
	shortC, longC *bolt.Cursor
	buf           []byte // appended to only: slices of it stay valid
}

// get returns the value of k in the bucket b (the long one when long),
// nil when there is none.
func (lt *leaseTx) get(b *bolt.Bucket, long bool, k []byte) []byte {
	c := &lt.shortC
	if long {
		c = &lt.longC
	}
	if *c == nil || (*c).Bucket() != b {
		*c = b.Cursor()
	}
	got, v := (*c).Seek(k)
	if !bytes.Equal(got, k) {
		return nil
	}
	return v
}

// bucket returns the bucket name (bucketLeases or bucketLeasesLong),
// made when create is set; nil when it does not exist and create is not.
func (lt *leaseTx) bucket(long, create bool) (*bolt.Bucket, error) {
	b, name := &lt.short, bucketLeases
	if long {
		b, name = &lt.long, bucketLeasesLong
	}
	if *b == nil {
		*b = lt.tx.Bucket(name)
	}
	if *b == nil && create {
		var err error
		if *b, err = lt.tx.CreateBucket(name); err != nil {
			return nil, err
		}
	}
	return *b, nil
}

// merge merges a lease write, a snapshot's mark or a window's deletion
// (how) into the record of key.
func (lt *leaseTx) merge(key string, l leaseRecord, how int) error {
	_, err := lt.mergeCounted(key, l, how)
	return err
}

// mergeCounted is merge, and reports whether it added the key's record.
func (lt *leaseTx) mergeCounted(key string, l leaseRecord, how int) (bool, error) {
	if how == leaseWindow && l.inc == 0 {
		return false, nil // the deletion of a window that never took a lease
	}
	long := longID(key)
	var k []byte
	if long {
		k = longKey(key)
	} else {
		n := len(lt.buf)
		lt.buf = append(lt.buf, key...)
		k = lt.buf[n:len(lt.buf):len(lt.buf)]
	}
	b, err := lt.bucket(long, true)
	if err != nil {
		return false, err
	}
	var cur leaseRecord
	v := lt.get(b, long, k)
	if v != nil {
		if long {
			_, enc, err := decodeLongValue(k, v)
			if err != nil {
				return false, err
			}
			v = enc
		}
		if cur, err = decodeLease(v); err != nil {
			return false, fmt.Errorf("device %s: %w", keyName([]byte(key)), err)
		}
	}
	switch {
	case how == leaseWindow:
		if cur.inc > l.inc {
			// A later incarnation of the key took a lease, and its
			// write committed first: its counts are not the deleted
			// window's, and dropping them would let a crash forget
			// its admissions.
			return false, nil
		}
		if cur.inc < l.inc {
			// Its lease write has not committed yet (or never will):
			// the record of the deletion makes sure that one coming
			// after it neither restores its counts nor charges it.
			cur = leaseRecord{inc: l.inc}
		}
		// The window's counts are gone (expired, or reset), and so is
		// the window: its lease is closed, all it could admit recorded
		// (l.rec, devicelimit's CollectLeases), beyond any lease write
		// of it, taken before the deletion; those admissions are held
		// by nothing and need no charge.
		cur.rec, cur.adm, cur.window = max(cur.rec, cur.adm, l.rec), 0, nil
	case cur.inc > l.inc:
		return false, nil
	case cur.inc < l.inc:
		cur = leaseRecord{inc: l.inc, length: l.length}
	}
	switch how {
	case leaseMark:
		cur.rec = max(cur.rec, l.rec)
	case leaseWrite:
		cur.cap, cur.length = max(cur.cap, l.cap), l.length
		if l.adm > cur.adm {
			cur.adm, cur.window = l.adm, l.window
		}
	}
	n := len(lt.buf)
	if long {
		lt.buf = appendLongValue(lt.buf, key, cur.append(nil))
	} else {
		lt.buf = cur.append(lt.buf)
	}
	return v == nil, b.Put(k, lt.buf[n:len(lt.buf):len(lt.buf)])
}

// SettleLeases settles, at the start after an unclean shutdown, every
// window whose stored lease is open (devicelimit.Table.SettleLease):
// restored from its latest lease write's counts when they are newer
// than its snapshot's, and charged what its lease could have admitted
// beyond them, no more than a lease, at tick at (the latest instant the
// crashed run could have admitted) or now, the earlier. Call it on a
// table just restored, before decisions start. In one transaction it
// then writes the settled windows and empties the leases, so that a
// crash right after cannot lose the charge, and the next run's leases
// start afresh. After a clean shutdown (charge false) it only empties
// them. It returns the number of windows charged.
func (s *Store) SettleLeases(t *devicelimit.Table, charge bool, at, now devicelimit.Tick) (int, error) {
	var keys []string
	charged := 0
	if charge {
		// The lease writes still in the lease log are read as those
		// merged: folded first (leaselog.go).
		err := s.update(func(tx *bolt.Tx) error {
			_, _, err := foldLeaseLog(tx, -1)
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("fold the lease log of %q: %w", s.path, err)
		}
		err = s.view(func(tx *bolt.Tx) error {
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
					changed, units, err := t.SettleLease(string(key), devicelimit.StoredLease{Inc: l.inc, Cap: l.cap, Recorded: l.rec,
						Length: l.length, Adm: l.adm, Window: l.window}, at, now)
					if err != nil {
						return fmt.Errorf("%w: device %s: %w", ErrCorrupt, keyName(key), err)
					}
					if units > 0 {
						charged++
					}
					if changed {
						keys = append(keys, string(key))
					}
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
			if err := putWindow(tx, t, key); err != nil {
				return err
			}
		}
		for _, name := range [][]byte{bucketLeases, bucketLeasesLong, bucketLeaseLog} {
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
	return charged, nil
}

// putWindow writes the table's window of key in tx, or deletes it when
// the table holds none.
func putWindow(tx *bolt.Tx, t *devicelimit.Table, key string) error {
	var enc []byte
	if w, ok := t.Snapshot(key); ok {
		var err error
		if enc, err = w.MarshalBinary(); err != nil {
			return err
		}
	}
	if longID(key) {
		b, err := longBucket(tx, bucketWindowsLong, true)
		if err != nil {
			return err
		}
		if enc == nil {
			return b.Delete(longKey(key))
		}
		return b.Put(longKey(key), appendLongValue(nil, key, enc))
	}
	if enc == nil {
		return tx.Bucket(bucketWindows).Delete([]byte(key))
	}
	return tx.Bucket(bucketWindows).Put([]byte(key), enc)
}

// Leaser writes a Table's leases (devicelimit.Table.EnableLeases):
// every lease asked since its last write goes in the next, appended to
// the lease log (leaselog.go) through the store's group commit (shared
// with deferred messages), and the
// admissions waiting for them are let go once it is durable. A write
// comes at once when an admission waits (after writeGap since the
// last), and at most lazyAfter after a lease asked early. A failed write is retried with the next batch. Create it
// with NewLeaser; safe for concurrent use.
type Leaser struct {
	store *Store
	table *devicelimit.Table
	log   *slog.Logger

	// lazy is how long leases asked early may wait (lazyAfter).
	lazy time.Duration
	// foldAt is the fewest entries the lease log holds before a write
	// folds it (foldLeaseLogAt).
	foldAt int
	// value is the last write's lease log value, for the next to reuse
	// (write runs on run's goroutine alone).
	value []byte
	// logged is the entries the lease log holds; folded, the records
	// its foldings added to "leases" (those a snapshot added are not
	// counted: it only folds sooner); foldBroken, a folding found the
	// log or the records damaged.
	logged, folded int
	foldBroken     bool

	writes  sync.Mutex // guards stats
	batches uint64     // lease writes committed
	records uint64     // lease records written
	// folds and foldedEntries count the lease log's foldings and the
	// entries they merged.
	folds, foldedEntries uint64

	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// NewLeaser returns a Leaser of t's leases into s and starts it. log
// nil discards.
func NewLeaser(s *Store, t *devicelimit.Table, log *slog.Logger) *Leaser {
	return newLeaser(s, t, log, lazyAfter, foldLeaseLogAt)
}

// newLeaser is NewLeaser with leases asked early written lazy after
// they are asked, and the lease log folded past foldAt entries.
func newLeaser(s *Store, t *devicelimit.Table, log *slog.Logger, lazy time.Duration, foldAt int) *Leaser {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Leaser{store: s, table: t, log: log, lazy: lazy, foldAt: foldAt, stop: make(chan struct{}), done: make(chan struct{})}
	go l.run()
	return l
}

// retryAfter is the pause before a failed lease write is tried again.
const retryAfter = 100 * time.Millisecond

// lazyAfter is how long leases that no admission waits for yet (asked
// early by windows that do not ask often, devicelimit.Table.LeaseAsked)
// may wait for their write: a write every lazyAfter at most takes them
// all, however many windows asked, in one transaction, instead of one
// per disk commit (a fleet of quiet devices asks a lease for nearly
// every message at a lease of 1: make bench-lease measures what that
// costs). A window that needs its lease sooner has it written at once
// (LeaseWake).
const lazyAfter = time.Second

// writeGap is the pause after a lease write before the next: the
// leases asked meanwhile go together in the next. Devices connecting
// by the hundred a second each wait for their first lease: without a
// pause their leases went in about one transaction each (7,500
// transactions for make sim-10k's ramp of 10,000 devices, most of what
// leases then cost its CPU); each waits at most writeGap more. At 5 ms
// the ramp took some 2,650 transactions and make bench-lease measured
// 1.11x the CPU without leases; at 20 ms some 900 and 1.04x, CONNACK
// p50 26 ms against 10 (docs/durability.md, "Measured"). The CONNACKs
// of one write keep their spacing (broker/cohort.go), so the longer
// pause no longer puts devices in step. Only writes that follow one
// another wait for it: a lease needed a while after the last write goes
// at once.
const writeGap = 20 * time.Millisecond

func (l *Leaser) run() {
	defer close(l.done)
	failing := false
	lazy := time.NewTimer(l.lazy)
	lazy.Stop()
	armed := false
	gap := time.NewTimer(writeGap)
	for {
		// Asks are listened to only until the timer is armed: the
		// asks after it wake nobody (they are thousands a second).
		asked := l.table.LeaseAsked()
		if armed {
			asked = nil
		}
		select {
		case <-l.stop:
			return
		case <-asked:
			lazy.Reset(l.lazy)
			armed = true
			continue
		case <-lazy.C:
			armed = false
		case <-l.table.LeaseWake():
			if armed {
				lazy.Stop()
				armed = false
			}
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
		pause := writeGap
		if err != nil {
			pause = retryAfter
		}
		gap.Reset(pause)
		select {
		case <-l.stop:
			return
		case <-gap.C:
		}
	}
}

// write writes one batch of leases: appended to the lease log as one
// value, and the log folded in part when it has grown past its
// threshold (leaselog.go).
func (l *Leaser) write() error {
	value, n := l.value[:0], 0
	gen, keys := l.table.TakeLeases(func(key string, le devicelimit.Lease) {
		value = appendLogEntry(value, key, le)
		n++
	})
	l.value = value
	if n > 0 {
		// Past its threshold the log is folded a part at a time, its
		// oldest values first, at least twice the batch: it shrinks,
		// and no one transaction folds a whole fleet's log (the group
		// commit's other writers wait for it). A log that cannot be
		// folded (damaged) is no longer tried: the lease writes go on.
		fold := !l.foldBroken && l.logged+n > max(l.foldAt, l.folded)
		limit := max(l.foldAt/4, 2*n)
		var folded, added int
		var foldErr error
		r := &request{done: make(chan error, 1), fn: func(tx *bolt.Tx) error {
			// Run again when another request of the commit fails: the
			// results are set afresh.
			folded, added, foldErr = 0, 0, nil
			if err := appendLeaseLog(tx, value); err != nil {
				return err
			}
			if fold {
				folded, added, foldErr = foldLeaseLog(tx, limit)
			}
			return foldErr
		}}
		if err := l.store.commit.do(r); err != nil {
			if errors.Is(foldErr, ErrCorrupt) {
				l.foldBroken = true
				l.log.Error("the lease log cannot be folded; lease writes go on appending to it, and the next start refuses the data file", "path", l.store.path, "err", foldErr)
			}
			l.table.RequeueLeases(keys)
			return fmt.Errorf("write %d leases to %q: %w", n, l.store.path, err)
		}
		l.logged += n - folded
		if fold {
			l.folded += added
			l.writes.Lock()
			l.folds++
			l.foldedEntries += uint64(folded)
			l.writes.Unlock()
		}
	}
	l.table.LeasesDurable(gen)
	l.table.ReleaseLeaseKeys(keys)
	l.writes.Lock()
	l.batches++
	l.records += uint64(n)
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

// Folds returns how many times the lease log was folded into "leases"
// and the entries those foldings merged.
func (l *Leaser) Folds() (folds, entries uint64) {
	l.writes.Lock()
	defer l.writes.Unlock()
	return l.folds, l.foldedEntries
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
