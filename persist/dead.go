package persist

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"
)

// A dead-letter log holds the messages a forward log's destination
// refused for good: each moved there, in one transaction, from its
// forward log, under the same sequence number, so that the forward log
// goes on. A bucket per forward log under "forward-dead"; the entry is
// the caller's.
var bucketDead = []byte("forward-dead")

// MoveForwardDead moves message seq of forward log log to that log's
// dead-letter log as entry, durably, in one transaction: it is never in
// both, nor in neither. When the dead-letter log then holds more than
// max entries (max > 0), the oldest go to make room; dropped says how
// many.
func (s *Store) MoveForwardDead(log string, seq uint64, entry []byte, max int) (dropped int, err error) {
	if err := validLog(log); err != nil {
		return 0, err
	}
	dropped, err = s.moveDead(log, []uint64{seq}, [][]byte{entry}, max)
	if err != nil {
		return 0, fmt.Errorf("move message %d of forward log %q to its dead letters in %q: %w", seq, log, s.path, err)
	}
	return dropped, nil
}

// MoveForwardDeadMany is MoveForwardDead of messages seqs, as entries
// (one each), all in one transaction; the oldest make room after all
// are in.
func (s *Store) MoveForwardDeadMany(log string, seqs []uint64, entries [][]byte, max int) (dropped int, err error) {
	if err := validLog(log); err != nil {
		return 0, err
	}
	if len(seqs) != len(entries) {
		return 0, fmt.Errorf("move %d messages of forward log %q to its dead letters: %d entries", len(seqs), log, len(entries))
	}
	dropped, err = s.moveDead(log, seqs, entries, max)
	if err != nil {
		return 0, fmt.Errorf("move %d messages of forward log %q to its dead letters in %q: %w", len(seqs), log, s.path, err)
	}
	return dropped, nil
}

// moveDead is MoveForwardDeadMany's transaction.
func (s *Store) moveDead(log string, seqs []uint64, entries [][]byte, max int) (dropped int, err error) {
	err = s.update(func(tx *bolt.Tx) error {
		root, err := tx.CreateBucketIfNotExists(bucketDead)
		if err != nil {
			return err
		}
		d, err := root.CreateBucketIfNotExists([]byte(log))
		if err != nil {
			return err
		}
		// Stats counts the keys of the committed pages, not this
		// transaction's changes: counted before the Puts, plus them.
		held := d.Stats().KeyN
		b := forwardBucket(tx, log)
		for i, seq := range seqs {
			if b != nil {
				if err := b.Delete(forwardKey(seq)); err != nil {
					return err
				}
			}
			if d.Get(forwardKey(seq)) == nil {
				held++
			}
			if err := d.Put(forwardKey(seq), entries[i]); err != nil {
				return err
			}
		}
		if max <= 0 || held <= max {
			return nil
		}
		over := held - max
		c := d.Cursor()
		for k, _ := c.First(); k != nil && dropped < over; k, _ = c.First() {
			if err := c.Delete(); err != nil {
				return err
			}
			dropped++
		}
		return nil
	})
	return dropped, err
}

// ReadDead calls fn, in sequence order, for the entries of log's
// dead-letter log from sequence number from on, until fn returns false.
// entry is valid only during the call.
func (s *Store) ReadDead(log string, from uint64, fn func(seq uint64, entry []byte) bool) error {
	if err := validLog(log); err != nil {
		return err
	}
	err := s.view(func(tx *bolt.Tx) error {
		b := deadBucket(tx, log)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, v := c.Seek(forwardKey(from)); k != nil; k, v = c.Next() {
			if len(k) != 8 {
				return fmt.Errorf("%w: dead letters of %q: a key of %d bytes", ErrCorrupt, log, len(k))
			}
			if !fn(binary.BigEndian.Uint64(k), v) {
				return errStopRead
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStopRead) {
		return fmt.Errorf("read the dead letters of forward log %q in %q: %w", log, s.path, err)
	}
	return nil
}

// DeleteDead removes entries seqs of log's dead-letter log durably, in
// one transaction that first checks they are all there: when one is
// not, it deletes none and the error wraps ErrNotHeld.
func (s *Store) DeleteDead(log string, seqs []uint64) error {
	if err := validLog(log); err != nil {
		return err
	}
	err := s.update(func(tx *bolt.Tx) error {
		b := deadBucket(tx, log)
		for _, seq := range seqs {
			if b == nil || b.Get(forwardKey(seq)) == nil {
				return fmt.Errorf("dead letter %d: %w", seq, ErrNotHeld)
			}
		}
		for _, seq := range seqs {
			if err := b.Delete(forwardKey(seq)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete %d dead letters of forward log %q in %q: %w", len(seqs), log, s.path, err)
	}
	return nil
}

// DeadCount returns how many entries log's dead-letter log holds.
func (s *Store) DeadCount(log string) (int, error) {
	if err := validLog(log); err != nil {
		return 0, err
	}
	n := 0
	err := s.view(func(tx *bolt.Tx) error {
		if b := deadBucket(tx, log); b != nil {
			n = b.Stats().KeyN
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("count the dead letters of forward log %q in %q: %w", log, s.path, err)
	}
	return n, nil
}

// takeDead deletes dead letter key of log, which must be there
// (ErrNotHeld otherwise).
func takeDead(tx *bolt.Tx, log, key []byte) error {
	b := deadBucket(tx, string(log))
	if b == nil || b.Get(key) == nil {
		return fmt.Errorf("dead letter %d: %w", binary.BigEndian.Uint64(key), ErrNotHeld)
	}
	return b.Delete(key)
}

func deadBucket(tx *bolt.Tx, log string) *bolt.Bucket {
	root := tx.Bucket(bucketDead)
	if root == nil {
		return nil
	}
	return root.Bucket([]byte(log))
}

// DeadLogs returns the names of the forward logs whose dead-letter logs
// hold entries, in name order.
func (s *Store) DeadLogs() ([]string, error) { return s.logsHolding(bucketDead, "dead-letter logs") }

// HeldLogs returns the names of the forward logs that hold messages or
// dead letters, in name order, each once.
func (s *Store) HeldLogs() ([]string, error) {
	logs, err := s.ForwardLogs()
	if err != nil {
		return nil, err
	}
	dead, err := s.DeadLogs()
	if err != nil {
		return nil, err
	}
	logs = append(logs, dead...)
	slices.Sort(logs)
	return slices.Compact(logs), nil
}

// logsHolding returns the names of the buckets under root that hold
// keys, in name order; what names them in the error.
func (s *Store) logsHolding(rootName []byte, what string) ([]string, error) {
	var names []string
	err := s.view(func(tx *bolt.Tx) error {
		root := tx.Bucket(rootName)
		if root == nil {
			return nil
		}
		return root.ForEachBucket(func(name []byte) error {
			if first, _ := root.Bucket(name).Cursor().First(); first != nil {
				names = append(names, string(name))
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list %s in %q: %w", what, s.path, err)
	}
	return names, nil
}

// DropDeadLog deletes every entry of log's dead-letter log durably and
// returns how many there were.
func (s *Store) DropDeadLog(log string) (int, error) {
	if err := validLog(log); err != nil {
		return 0, err
	}
	n := 0
	err := s.update(func(tx *bolt.Tx) error {
		b := deadBucket(tx, log)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.First() {
			if err := c.Delete(); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("drop the dead letters of forward log %q in %q: %w", log, s.path, err)
	}
	return n, nil
}
