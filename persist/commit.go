package persist

import (
	"bytes"
	"encoding/binary"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
)

// maxCommitBytes bounds the key and record bytes one group commit
// writes; requests beyond it wait for the next transaction, which starts
// right after. A single larger request still goes alone.
const maxCommitBytes = 16 << 20

// committer is the store's group commit for deferred messages: one
// goroutine takes every request queued since its last transaction,
// applies them all in one bbolt transaction, commits (one fsync for all)
// and answers each. Requests that arrive during a commit make up the
// next one, so a transaction holds as many requests as arrived while the
// previous one was written: no timer, no delay when the store is idle,
// and the batch grows with the load.
//
// bbolt's DB.Batch does the same with a timer: a batch starts
// MaxBatchDelay (10 ms) after its first call or when MaxBatchSize calls
// are in. With publishers that wait for their ack the batch cannot fill,
// so every batch waits for the timer; BenchmarkEnqueue measures both.
type committer struct {
	db *bolt.DB

	mu     sync.Mutex
	queue  []*request
	spare  []*request // the previous queue, reused
	closed bool
	gen    uint64     // transactions ended, committed or not
	ended  bool       // the loop has returned
	turn   *sync.Cond // on mu: signalled when gen grows or the loop ends

	wake chan struct{} // capacity 1: there is work or the committer closes
	done chan struct{} // closed when the loop has ended

	// pending counts the requests queued or in a transaction: a
	// snapshot ends its transaction early when it is not zero.
	pending atomic.Int64
	// note records each transaction's outcome in the store's health.
	note func(err error, size int)
	// space is the free-space floor puts must keep above; nil: none.
	space *space
	// txs counts the transactions committed, delsOnly those of them
	// that carried deletions alone (Store.Commits).
	txs, delsOnly atomic.Uint64
}

// Commits counts the group commit's transactions since Open.
type Commits struct {
	Transactions uint64 // committed (or failed) transactions
	// DeletionsOnly are those of Transactions that carried deletions
	// alone (of forward log messages or deferred ones), no put: with
	// appends coming, a deletion rides in their transaction instead.
	DeletionsOnly uint64
}

// Commits returns the counts of the group commit's transactions.
func (s *Store) Commits() Commits {
	return Commits{Transactions: s.commit.txs.Load(), DeletionsOnly: s.commit.delsOnly.Load()}
}

// request is one queued operation: a put of rec under key, or the
// deletion of dels. It is answered on done (capacity 1) and reused.
type request struct {
	// log names the forward log the request writes (forward.go); nil:
	// the deferred messages' bucket.
	log  []byte
	key  []byte
	rec  []byte
	dels [][]byte
	// take, with a put of a forward log's message, is the key of the
	// dead letter of that log the put replays: deleted in the same
	// transaction, and the request fails (ErrNotHeld) without it.
	take []byte
	// fn, when set, is the request: it writes what it will in the
	// transaction (a batch of leases, leases.go).
	fn   func(*bolt.Tx) error
	done chan error
	// answered is set, for every request of a transaction, before the
	// first of them is answered on done: whoever is woken by one sees
	// the others' answers coming without waiting for them (Queued.Ready).
	answered atomic.Bool
}

var requests = sync.Pool{New: func() any { return &request{done: make(chan error, 1)} }}

func newCommitter(db *bolt.DB, note func(err error, size int)) *committer {
	c := &committer{
		db:   db,
		note: note,
		wake: make(chan struct{}, 1),
		done: make(chan struct{}),
	}
	c.turn = sync.NewCond(&c.mu)
	go c.run()
	return c
}

// do queues r and waits for its transaction. It returns ErrClosed, and
// does nothing, once close has started: every request queued before
// that is committed (or fails) before close returns.
func (c *committer) do(r *request) error {
	if err := c.submit(r); err != nil {
		return err
	}
	return <-r.done
}

// submit queues r without waiting: its answer comes on r.done. It
// returns ErrClosed, and queues nothing, once close has started.
func (c *committer) submit(r *request) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.pending.Add(1)
	c.queue = append(c.queue, r)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default: // already signalled
	}
	return nil
}

// close stops taking requests, waits until those queued are answered,
// and ends the loop.
func (c *committer) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	<-c.done
}

// waitTurn lets queued requests go first: when any are waiting, it
// returns once the committer has ended a transaction (or its loop). A
// snapshot calls it between its transactions; without it, the snapshot
// could take bbolt's writer lock again before the committer, waiting
// on that lock, is even scheduled.
func (c *committer) waitTurn() {
	if c.pending.Load() == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for g := c.gen; c.gen == g && c.pending.Load() > 0 && !c.ended; {
		c.turn.Wait()
	}
}

func (c *committer) run() {
	defer close(c.done)
	defer func() {
		c.mu.Lock()
		c.ended = true
		c.turn.Broadcast()
		c.mu.Unlock()
	}()
	for range c.wake {
		for {
			c.mu.Lock()
			batch := c.queue
			if len(batch) == 0 {
				closed := c.closed
				c.mu.Unlock()
				if closed {
					return
				}
				break // wait for the next wake
			}
			c.queue = c.spare[:0]
			c.mu.Unlock()
			for rest := batch; len(rest) > 0; {
				n := fit(rest)
				c.commit(rest[:n])
				rest = rest[n:]
			}
			clear(batch) // the requests go back to the pool
			c.spare = batch[:0]
		}
	}
}

// fit returns how many of reqs, at least one, one transaction takes.
func fit(reqs []*request) int {
	size := 0
	for i, r := range reqs {
		size += len(r.key) + len(r.rec)
		for _, k := range r.dels {
			size += len(k)
		}
		if size > maxCommitBytes && i > 0 {
			return i
		}
	}
	return len(reqs)
}

// commit applies reqs in one transaction and answers each. A request
// that fails to apply (a damaged file) is answered with its error and
// the others are retried without it; a failed commit fails them all, and
// then none of them is stored.
func (c *committer) commit(reqs []*request) {
	defer func() {
		c.mu.Lock()
		c.gen++
		c.turn.Broadcast()
		c.mu.Unlock()
	}()
	reqs = c.keepFloor(reqs)
	for len(reqs) > 0 {
		failed := -1
		err := guard(func() error {
			return closedErr(c.db.Update(func(tx *bolt.Tx) error {
				var last *bolt.Bucket
				var lastLog []byte
				for i, r := range reqs {
					failed = i
					if r.fn != nil {
						if err := r.fn(tx); err != nil {
							return err
						}
						continue
					}
					b := last
					if b == nil || !bytes.Equal(r.log, lastLog) {
						var err error
						if b, err = requestBucket(tx, r.log); err != nil {
							return err
						}
						last, lastLog = b, r.log
					}
					if r.take != nil {
						if err := takeDead(tx, r.log, r.take); err != nil {
							return err
						}
					}
					if err := r.apply(b); err != nil {
						return err
					}
				}
				failed = -1 // a panic or error from here on is the commit's
				return nil
			}))
		})
		if err != nil && failed >= 0 {
			// That request's own failure (its record cannot be
			// stored), not the disk's: the others go on.
			c.answer(reqs[failed], err)
			reqs = append(reqs[:failed], reqs[failed+1:]...)
			continue
		}
		size := 0 // the records' bytes: what needs room in the file
		for _, r := range reqs {
			size += len(r.rec)
		}
		c.note(err, size)
		c.count(reqs)
		for _, r := range reqs {
			r.answered.Store(true)
		}
		for _, r := range reqs {
			c.answer(r, err)
		}
		return
	}
}

// keepFloor answers the puts of reqs with ErrLowSpace, and returns the
// other requests, when writing them would leave the data file less room
// than the floor: twice their bytes, for bbolt's page headers, half-full
// pages and branch pages. Deletions and leases always go.
func (c *committer) keepFloor(reqs []*request) []*request {
	if c.space == nil || c.space.floor <= 0 {
		return reqs
	}
	var puts int64
	for _, r := range reqs {
		if r.fn == nil && r.dels == nil {
			puts += int64(len(r.key) + len(r.rec))
		}
	}
	if puts == 0 {
		return reqs
	}
	if !c.space.check(2 * puts) {
		return reqs
	}
	err := c.space.err()
	kept := reqs[:0]
	for _, r := range reqs {
		if r.fn == nil && r.dels == nil {
			c.answer(r, err)
		} else {
			kept = append(kept, r)
		}
	}
	return kept
}

// count counts the transaction of reqs in txs and delsOnly.
func (c *committer) count(reqs []*request) {
	c.txs.Add(1)
	for _, r := range reqs {
		if r.dels == nil {
			return
		}
	}
	c.delsOnly.Add(1)
}

func (c *committer) answer(r *request, err error) {
	c.pending.Add(-1)
	r.answered.Store(true)
	r.done <- err
}

// requestBucket returns the bucket a request writes, made if missing:
// the deferred messages', or forward log log's.
func requestBucket(tx *bolt.Tx, log []byte) (*bolt.Bucket, error) {
	if log == nil {
		return tx.CreateBucketIfNotExists(bucketDeferred)
	}
	root, err := tx.CreateBucketIfNotExists(bucketForward)
	if err != nil {
		return nil, err
	}
	return root.CreateBucketIfNotExists(log)
}

// apply writes r in b. Applying it twice has the effect of once.
func (r *request) apply(b *bolt.Bucket) error {
	if r.dels == nil {
		if r.log != nil && len(r.key) == 8 {
			// The log's high-water, kept when its messages are deleted:
			// a forward log never numbers two messages alike (forward.go).
			if seq := binary.BigEndian.Uint64(r.key); seq > b.Sequence() {
				if err := b.SetSequence(seq); err != nil {
					return err
				}
			}
		}
		return b.Put(r.key, r.rec)
	}
	for _, k := range r.dels {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
