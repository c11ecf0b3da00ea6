package persist

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
)

// DefaultInterval is the time between snapshots when NewSnapshotter is
// given none.
const DefaultInterval = time.Second

// defaultChunk is the most windows one snapshot transaction writes. A
// bigger snapshot is split over several transactions, so bbolt's dirty
// pages for one transaction stay bounded and override writes, which
// wait for the snapshot's transaction, wait less.
const defaultChunk = 200_000

// A snapshot transaction ends before its chunk is written when deferred
// messages wait for bbolt's only writer and the transaction has run for
// yieldAfter; the snapshot then lets their group commit go before its
// next transaction. An enqueue thus waits about yieldAfter plus the
// commit of what the snapshot wrote so far, instead of a whole chunk.
// Measured with 50 publishers and snapshots of a million windows
// (BenchmarkEnqueueDuringSnapshot): with whole 200k chunks, enqueues
// waited up to 570 ms (p99 290 ms), or 160-190 ms (p99 130-160 ms) once
// they went first between chunks; ending transactions after 10 ms,
// 40-77 ms (p99 28-36 ms), for snapshots of 1.2 s instead of 0.9-1.0 s.
// 5 ms gains little more (p99 23 ms) for 1.4 s snapshots. Without
// waiting deferred messages nothing changes. The clock is read every
// yieldEvery windows.
const (
	yieldAfter = 10 * time.Millisecond
	yieldEvery = 256
)

// windowFill is the fill percent of split pages in the windows bucket.
// Snapshots put keys in sorted order, so a page that overflows is split
// near full; the remainder leaves room for new devices between keys.
const windowFill = 0.9

// SnapshotStats describes one snapshot.
type SnapshotStats struct {
	// Windows is the number of windows written.
	Windows int
	// Deleted is the number of windows deleted (evicted, reset, or
	// emptied before they were written).
	Deleted int
	// Bytes is the number of key and value bytes written.
	Bytes int
	// Took is the time from the start of the collection to the last
	// commit.
	Took time.Duration
}

// Snapshotter writes a Table's changed windows to a Store: every
// interval once started, when Snapshot is called, and a last time on
// Close. Create it with NewSnapshotter after restoring the table. Safe
// for concurrent use; snapshots are serialized.
type Snapshotter struct {
	store    *Store
	table    *devicelimit.Table
	clock    devicelimit.Clock
	interval time.Duration
	log      *slog.Logger
	// chunk is the most windows written per transaction.
	chunk int
	// yield is how long a transaction runs before it ends early for
	// waiting deferred messages; 0 never ends one early.
	yield time.Duration

	mu   sync.Mutex // held for a whole snapshot
	pend batch      // collected and not yet written
	long batch      // the same, of device IDs too long to be keys
	// longMarks are the lease marks of the windows in long, written
	// with them.
	longMarks []longMark
	markBuf   []byte
	hw        devicelimit.Tick
	failures  int // consecutive failed snapshots of the loop
	closed    bool

	// stats of the last snapshot that wrote something, and how many did,
	// for metrics; guarded by statsMu so a scrape never waits for a
	// snapshot in progress.
	statsMu sync.Mutex
	last    SnapshotStats
	written uint64

	life      sync.Mutex // guards started and stopped
	started   bool
	stopped   bool
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// NewSnapshotter returns a Snapshotter of t to s that reads the high-water
// from c. interval is DefaultInterval when <= 0; log nil discards.
func NewSnapshotter(s *Store, t *devicelimit.Table, c devicelimit.Clock, interval time.Duration, log *slog.Logger) *Snapshotter {
	if interval <= 0 {
		interval = DefaultInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t.SetCollectInterval(interval) // an idle lease closes after two window lengths (devicelimit/lease.go)
	return &Snapshotter{
		store: s, table: t, clock: c, interval: interval, log: log,
		chunk: defaultChunk,
		yield: yieldAfter,
		hw:    s.meta.HighWater,
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
}

// Start starts the loop that takes a snapshot every interval. Calls after
// the first, or after Close, do nothing.
func (sn *Snapshotter) Start() {
	sn.life.Lock()
	defer sn.life.Unlock()
	if sn.started || sn.stopped {
		return
	}
	sn.started = true
	go sn.run()
}

func (sn *Snapshotter) run() {
	defer close(sn.done)
	t := time.NewTicker(sn.interval)
	defer t.Stop()
	for {
		select {
		case <-sn.stop:
			return
		case <-t.C:
			sn.tick()
		}
	}
}

// tick takes one snapshot and logs its failure: at Error on the first
// failure of a streak, at Info when it ends. The failed batch is kept and
// written first by the next snapshot.
func (sn *Snapshotter) tick() {
	_, err := sn.Snapshot()
	switch {
	case err != nil:
		sn.failures++
		if sn.failures == 1 {
			sn.log.Error("snapshot failed; retrying every interval", "err", err, "pending", sn.pending())
		}
	case sn.failures > 0:
		sn.log.Info("snapshot written after failures", "path", sn.store.path, "failures", sn.failures)
		sn.failures = 0
	}
}

func (sn *Snapshotter) pending() int {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	return len(sn.pend.items) + len(sn.long.items)
}

// Snapshot writes the windows changed since the last successful snapshot,
// and the clock high-water, now. It writes nothing when nothing changed.
// On error, the windows not yet committed are kept and written by the
// next snapshot, before any newer change of the same windows; the stats
// count what was committed.
func (sn *Snapshotter) Snapshot() (SnapshotStats, error) {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if sn.closed {
		return SnapshotStats{}, ErrClosed
	}
	return sn.snapshot(false)
}

// Stats returns the statistics of the last snapshot that wrote
// something, and how many snapshots have written something, for metrics.
// It does not wait for a snapshot in progress.
func (sn *Snapshotter) Stats() (last SnapshotStats, written uint64) {
	sn.statsMu.Lock()
	defer sn.statsMu.Unlock()
	return sn.last, sn.written
}

// Close stops the loop, waiting for a snapshot in progress (or for ctx),
// then writes a final snapshot that also sets the clean-shutdown flag.
// The final snapshot is not interrupted by ctx: abandoning it would lose
// admissions. Close does not close the Store. It is safe to call without
// Start, and calls after the first return its result.
func (sn *Snapshotter) Close(ctx context.Context) error {
	sn.closeOnce.Do(func() { sn.closeErr = sn.close(ctx) })
	return sn.closeErr
}

func (sn *Snapshotter) close(ctx context.Context) error {
	sn.life.Lock()
	started := sn.started
	sn.stopped = true
	sn.life.Unlock()
	if started {
		close(sn.stop)
		select {
		case <-sn.done:
		case <-ctx.Done():
			select {
			case <-sn.done: // stopped just as ctx ended: go on
			default:
				return fmt.Errorf("close snapshotter: waiting for a snapshot in progress: %w", ctx.Err())
			}
		}
	}
	sn.mu.Lock()
	defer sn.mu.Unlock()
	sn.closed = true
	if _, err := sn.snapshot(true); err != nil {
		return fmt.Errorf("final snapshot: %w", err)
	}
	return nil
}

// snapshot collects the table's changes behind those kept from a failed
// snapshot, and writes them; final writes the meta data even when
// nothing changed, with the clean-shutdown flag. Called with sn.mu held.
func (sn *Snapshotter) snapshot(final bool) (SnapshotStats, error) {
	start := time.Now()
	sn.pend.grow(sn.table.Dirty())
	sn.table.CollectLeases(sn.add)
	// Read after Collect: every collected admission happened at or
	// before this tick.
	sn.hw = max(sn.hw, sn.clock.Now())
	if len(sn.pend.items) == 0 && len(sn.long.items) == 0 && !final {
		// Nothing changed, but the high-water is written all the same:
		// after a crash it bounds when the admissions lost since could
		// have been made (see devicelimit.Table.ChargeLease), so it
		// must be at most one interval old.
		err := sn.store.update(func(tx *bolt.Tx) error {
			return tx.Bucket(bucketMeta).Put(keyClock, encodeClock(sn.hw))
		})
		return SnapshotStats{}, err
	}
	sn.pend.sort()
	sn.long.sort()
	st, err := sn.write(final)
	st.Took = time.Since(start)
	if err != nil {
		return st, err
	}
	sn.pend.reset()
	sn.long.reset()
	sn.longMarks = sn.longMarks[:0]
	if st.Windows+st.Deleted > 0 {
		sn.statsMu.Lock()
		sn.last, sn.written = st, sn.written+1
		sn.statsMu.Unlock()
		sn.log.Debug("snapshot written", "windows", st.Windows, "deleted", st.Deleted, "bytes", st.Bytes, "took", st.Took)
	}
	return st, nil
}

// longMark is the lease mark of a long device ID's window, or the
// incarnation of its deleted window (del).
type longMark struct {
	key string
	m   devicelimit.LeaseMark
	del bool
}

// add is Table.CollectLeases' callback. The change of a device ID too
// long to be a key goes to sn.long, keyed by the ID's hash, with the ID
// in the value (see longKey); a window that emptied is a deletion
// there. A window's lease mark goes in front of its encoding (see
// splitMarked), to be merged into its lease in the transaction that
// writes the window; the deletion of a leased window is its mark (the
// incarnation deleted) with no encoding.
func (sn *Snapshotter) add(device string, enc []byte, m devicelimit.LeaseMark) {
	if longID(device) {
		var v []byte
		if enc != nil && !emptyWindow(enc) {
			v = appendLongValue(nil, device, enc)
		}
		sn.long.add(string(longKey(device)), v)
		if m.Inc != 0 || enc == nil { // a mark, or a deletion
			sn.longMarks = append(sn.longMarks, longMark{device, m, enc == nil})
		}
		return
	}
	if enc == nil && m.Inc == 0 {
		sn.pend.add(device, nil) // a window without a lease: no lease record to touch
		return
	}
	b := sn.markBuf[:0]
	b = append(b, 0)
	if m.Inc != 0 {
		b = binary.AppendUvarint(b, m.Inc)
		b = binary.AppendUvarint(b, m.Recorded)
		b[0] = byte(len(b) - 1)
	}
	b = append(b, enc...)
	sn.markBuf = b
	sn.pend.add(device, b)
}

// splitMarked splits a pending value (add) into the window's lease mark
// and its encoding.
func splitMarked(v []byte) (devicelimit.LeaseMark, []byte) {
	n := int(v[0])
	var m devicelimit.LeaseMark
	if n > 0 {
		inc, k := binary.Uvarint(v[1:])
		rec, _ := binary.Uvarint(v[1+k:])
		m = devicelimit.LeaseMark{Inc: inc, Recorded: rec}
	}
	return m, v[1+n:]
}

// emptyWindow reports whether enc, a window encoding (a version byte,
// uvarints for the length, the head and the number of counts, then one
// uvarint per count), holds no count: every count is the one byte 0.
func emptyWindow(enc []byte) bool {
	if len(enc) == 0 {
		return false
	}
	b := enc[1:]
	for range 3 {
		_, n := binary.Uvarint(b)
		if n <= 0 {
			return false
		}
		b = b[n:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// writeLong writes the sorted pending changes of long device IDs in tx,
// counting them in st. They are few: the last transaction of a snapshot
// writes them all, so they stay pending whole when it fails.
func (sn *Snapshotter) writeLong(tx *bolt.Tx, st *SnapshotStats) error {
	if len(sn.long.items) == 0 {
		return nil
	}
	b, err := longBucket(tx, bucketWindowsLong, true)
	if err != nil {
		return err
	}
	lt := leaseTx{tx: tx}
	for _, lm := range sn.longMarks {
		how := leaseMark
		if lm.del {
			how = leaseWindow
		}
		if err := lt.merge(lm.key, leaseRecord{inc: lm.m.Inc, rec: lm.m.Recorded}, how); err != nil {
			return err
		}
	}
	for _, it := range sn.long.items {
		key, value := sn.long.record(it)
		if value == nil {
			if err := b.Delete(key); err != nil {
				return err
			}
			st.Deleted++
			continue
		}
		if err := b.Put(key, value); err != nil {
			return err
		}
		st.Windows++
		st.Bytes += len(key) + len(value)
	}
	return nil
}

// write writes the sorted pending entries in transactions of at most
// sn.chunk windows, ended early when deferred messages wait (see
// yieldAfter), and lets those go first between transactions; the last
// transaction also writes the changes of long device IDs (writeLong), the
// high-water (and, when final, the clean
// flag). On error, the entries of the failed transaction and after it
// stay pending.
func (sn *Snapshotter) write(final bool) (SnapshotStats, error) {
	var st SnapshotStats
	items := sn.pend.items
	commit := sn.store.commit
	for i := 0; ; {
		j := min(i+sn.chunk, len(items))
		var cs SnapshotStats
		err := sn.store.update(func(tx *bolt.Tx) error {
			start := time.Now()
			b := tx.Bucket(bucketWindows)
			b.FillPercent = windowFill
			lt := leaseTx{tx: tx}
			for k, it := range items[i:j] {
				if k > 0 && k%yieldEvery == 0 && sn.yield > 0 && commit.pending.Load() > 0 && time.Since(start) >= sn.yield {
					j = i + k
					break
				}
				key, value := sn.pend.record(it)
				if value != nil {
					var m devicelimit.LeaseMark
					m, value = splitMarked(value)
					how := leaseMark
					if len(value) == 0 {
						how, value = leaseWindow, nil // the deletion of a leased window
					}
					if m.Inc != 0 {
						if err := lt.merge(string(key), leaseRecord{inc: m.Inc, rec: m.Recorded}, how); err != nil {
							return err
						}
					}
				}
				// A window whose counts all expired after its last
				// admission (Sweep advances the ring) is deleted: a
				// restore would drop it, leaving its key behind for good.
				if value == nil || emptyWindow(value) {
					if err := b.Delete(key); err != nil {
						return err
					}
					cs.Deleted++
					continue
				}
				if err := b.Put(key, value); err != nil {
					return err
				}
				cs.Windows++
				cs.Bytes += len(key) + len(value)
			}
			if j < len(items) {
				return nil
			}
			if err := sn.writeLong(tx, &cs); err != nil {
				return err
			}
			meta := tx.Bucket(bucketMeta)
			if err := meta.Put(keyClock, encodeClock(sn.hw)); err != nil {
				return err
			}
			if final {
				return meta.Put(keyClean, encodeClean(true))
			}
			return nil
		})
		if err != nil {
			sn.pend.items = append(items[:0], items[i:]...)
			return st, fmt.Errorf("write snapshot to %q: %w", sn.store.path, err)
		}
		st.Windows += cs.Windows
		st.Deleted += cs.Deleted
		st.Bytes += cs.Bytes
		if j == len(items) {
			return st, nil
		}
		i = j
		commit.waitTurn()
	}
}
