package persist

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// A forward log holds, in order, the messages one upstream connection
// has still to deliver: appended before the device is acknowledged,
// deleted once the upstream acknowledged them. Each log is a bucket of
// its own under "forward", keyed by an 8-byte big-endian sequence number
// the caller assigns in increasing order, so a read in key order is the
// order of appends; the record is the caller's. Appends and deletions
// share the store's group commit with the deferral queue: a device's
// publish costs one transaction shared with everyone's.
//
// The backlog lives in the file (bbolt's memory map), not in the heap:
// reading a log walks it from a sequence number on, a page at a time.

// validLog checks a forward log's name: 1..255 bytes (a bbolt bucket
// name).
func validLog(log string) error {
	if log == "" || len(log) > 255 {
		return fmt.Errorf("forward log name must be 1 to 255 bytes (got %d)", len(log))
	}
	return nil
}

func forwardKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq) }

// AppendForward stores rec as message seq of forward log log durably: it
// returns only after the transaction holding it was committed and
// fsynced, in a group commit shared with concurrent appends and
// deferrals (see Enqueue for what an error means). A record already
// stored under seq is replaced. rec is not retained.
func (s *Store) AppendForward(log string, seq uint64, rec []byte) error {
	q, err := s.AppendForwardAsync(log, seq, rec)
	if err != nil {
		return err
	}
	return q.Wait()
}

// AppendForwardAsync is AppendForward without the wait: the record is
// queued for the next group commit, and the Queued returned says when it
// is durable (or why it is not). rec must not change until then.
// Records are committed in the order they were queued (the committer
// takes its queue in order), so a caller that numbers and queues under
// one lock never leaves a gap for a reader to see.
func (s *Store) AppendForwardAsync(log string, seq uint64, rec []byte) (Queued, error) {
	return s.appendForward(log, seq, rec, 0)
}

// ReplayDeadAsync is AppendForwardAsync of a dead letter replayed: the
// transaction that appends rec as message seq also deletes entry dead
// of the log's dead-letter log, so that a crash leaves the message in
// one of the two logs, never in both nor in neither. When the
// dead-letter log does not hold dead (any longer), nothing is written
// and Wait's error wraps ErrNotHeld.
func (s *Store) ReplayDeadAsync(log string, dead, seq uint64, rec []byte) (Queued, error) {
	return s.appendForward(log, seq, rec, dead)
}

// Queued is an append to a forward log queued for the group commit
// (AppendForwardAsync, ReplayDeadAsync). It is a value: queueing one
// allocates nothing of its own.
type Queued struct {
	s         *Store
	r         *request
	log       string
	seq, dead uint64
}

// Ready reports, without waiting, whether the transaction that holds
// the append has ended (committed or not): Wait then returns as soon as
// the committer has answered it, which it does for a whole transaction
// in one go. Only before Wait.
func (q Queued) Ready() bool { return q.r.answered.Load() }

// Wait, called once, returns when the append is durable, or why it is
// not.
func (q Queued) Wait() error {
	r := q.r
	err := <-r.done
	r.rec, r.take = nil, nil
	requests.Put(r)
	if err == nil {
		return nil
	}
	if q.dead != 0 {
		return fmt.Errorf("replay dead letter %d as message %d of forward log %q in %q: %w", q.dead, q.seq, q.log, q.s.path, err)
	}
	return fmt.Errorf("append message %d to forward log %q in %q: %w", q.seq, q.log, q.s.path, err)
}

// appendForward queues the append of rec as message seq of log, which
// takes dead letter dead when dead is not 0 (no message is numbered 0).
func (s *Store) appendForward(log string, seq uint64, rec []byte, dead uint64) (Queued, error) {
	if err := validLog(log); err != nil {
		return Queued{}, err
	}
	if int64(len(rec)) > bolt.MaxValueSize {
		return Queued{}, fmt.Errorf("append to forward log %q: %d bytes, the store keeps at most %d", log, len(rec), int64(bolt.MaxValueSize))
	}
	r := requests.Get().(*request)
	r.log = append(r.log[:0], log...) // the pooled request's: Enqueue sets its own nil
	r.key = binary.BigEndian.AppendUint64(r.key[:0], seq)
	r.rec = rec
	r.take = nil
	r.answered.Store(false)
	if dead != 0 {
		r.take = binary.BigEndian.AppendUint64(make([]byte, 0, 8), dead)
	}
	q := Queued{s: s, r: r, log: log, seq: seq, dead: dead}
	if err := s.commit.submit(r); err != nil {
		r.done <- err // answered here: Wait releases r and says why
		return Queued{}, q.Wait()
	}
	return q, nil
}

// DeleteForward removes messages of forward log log durably (the
// upstream acknowledged them), in transactions shared with appends.
// Sequence numbers not stored are not an error.
func (s *Store) DeleteForward(log string, seqs []uint64) error {
	if err := validLog(log); err != nil {
		return err
	}
	if s.closed.Load() {
		return fmt.Errorf("delete from forward log %q in %q: %w", log, s.path, ErrClosed)
	}
	for len(seqs) > 0 {
		chunk := seqs[:min(len(seqs), s.delChunk)]
		seqs = seqs[len(chunk):]
		dels := make([][]byte, len(chunk))
		for i, seq := range chunk {
			dels[i] = forwardKey(seq)
		}
		if err := s.commit.do(&request{log: []byte(log), dels: dels, done: make(chan error, 1)}); err != nil {
			return fmt.Errorf("delete %d messages from forward log %q in %q: %w", len(dels), log, s.path, err)
		}
	}
	return nil
}

// errStopRead ends a ReadForward early.
var errStopRead = errors.New("stop")

// ReadForward calls fn, in sequence order, for the messages of forward
// log log from sequence number from on, until fn returns false or the
// log ends. rec is valid only during the call. A log never written is
// empty.
func (s *Store) ReadForward(log string, from uint64, fn func(seq uint64, rec []byte) bool) error {
	if err := validLog(log); err != nil {
		return err
	}
	err := s.view(func(tx *bolt.Tx) error {
		b := forwardBucket(tx, log)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, v := c.Seek(forwardKey(from)); k != nil; k, v = c.Next() {
			if len(k) != 8 {
				return fmt.Errorf("%w: forward log %q: a key of %d bytes", ErrCorrupt, log, len(k))
			}
			if !fn(binary.BigEndian.Uint64(k), v) {
				return errStopRead
			}
		}
		return nil
	})
	if errors.Is(err, errStopRead) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read forward log %q in %q: %w", log, s.path, err)
	}
	return nil
}

// ForwardStats returns the number of messages and record bytes held by
// forward log log, the sequence number of its first message (0 when it
// is empty) and the highest ever appended to it, kept when its messages
// are deleted (0 for a log never written), so a caller that numbers on
// from last never reuses a number. Counting walks the log.
func (s *Store) ForwardStats(log string) (messages int, bytes int64, first, last uint64, err error) {
	if err := validLog(log); err != nil {
		return 0, 0, 0, 0, err
	}
	err = s.view(func(tx *bolt.Tx) error {
		b := forwardBucket(tx, log)
		if b == nil {
			return nil
		}
		defer func() { last = max(last, b.Sequence()) }()
		return b.ForEach(func(k, v []byte) error {
			if len(k) != 8 {
				return fmt.Errorf("%w: forward log %q: a key of %d bytes", ErrCorrupt, log, len(k))
			}
			seq := binary.BigEndian.Uint64(k)
			if messages == 0 {
				first = seq
			}
			last = seq
			messages++
			bytes += int64(len(v))
			return nil
		})
	})
	if err != nil {
		return 0, 0, 0, 0, fmt.Errorf("forward log %q in %q: %w", log, s.path, err)
	}
	return messages, bytes, first, last, nil
}

// forwardBucket returns forward log log's bucket, or nil.
func forwardBucket(tx *bolt.Tx, log string) *bolt.Bucket {
	root := tx.Bucket(bucketForward)
	if root == nil {
		return nil
	}
	return root.Bucket([]byte(log))
}

// ForwardLogs returns the names of the forward logs that hold messages,
// in name order.
func (s *Store) ForwardLogs() ([]string, error) { return s.logsHolding(bucketForward, "forward logs") }

var keyOrigin = []byte("origin")

// Origin returns the data file's origin: 16 hex digits drawn at random
// the first time it is asked for and kept in the file. A forward
// message's ID starts with it, so two gateways (or a data file made
// anew) never give two messages the same ID.
func (s *Store) Origin() (string, error) {
	var id []byte
	err := s.view(func(tx *bolt.Tx) error {
		id = bytes.Clone(tx.Bucket(bucketMeta).Get(keyOrigin))
		return nil
	})
	if err == nil && id == nil {
		err = s.update(func(tx *bolt.Tx) error {
			meta := tx.Bucket(bucketMeta)
			if id = bytes.Clone(meta.Get(keyOrigin)); id != nil {
				return nil
			}
			var b [8]byte
			rand.Read(b[:]) // never fails (crypto/rand)
			id = hex.AppendEncode(nil, b[:])
			return meta.Put(keyOrigin, id)
		})
	}
	if err != nil {
		return "", fmt.Errorf("origin of %q: %w", s.path, err)
	}
	return string(id), nil
}

// DropForward deletes every message of forward log log durably and
// returns how many there were. The log keeps its high-water: its next
// message is numbered after the last it held.
func (s *Store) DropForward(log string) (int, error) {
	if err := validLog(log); err != nil {
		return 0, err
	}
	n := 0
	err := s.update(func(tx *bolt.Tx) error {
		b := forwardBucket(tx, log)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, _ := c.Last(); len(k) == 8; k, _ = c.Last() {
			if seq := binary.BigEndian.Uint64(k); seq > b.Sequence() {
				if err := b.SetSequence(seq); err != nil {
					return err
				}
			}
			if err := c.Delete(); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("drop forward log %q in %q: %w", log, s.path, err)
	}
	return n, nil
}
