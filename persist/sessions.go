package persist

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Kept sessions and the commands queued in them, as records the broker
// encodes (broker/keptsessions.go): a client that keeps its MQTT session
// (3.1.1 without clean session, MQTT 5 with a session expiry) keeps it
// across a restart or a crash of the gateway, with the commands from
// upstream queued in it and not yet acknowledged.
var (
	// bucketSessions holds a record per client ID. Made on the first
	// kept session.
	bucketSessions = []byte("sessions")
	// bucketCommands holds the commands queued in kept sessions, keyed
	// by commandKey. Made on the first such command.
	bucketCommands = []byte("session-commands")
)

// commandKey is a command's key: the client ID's length (2 bytes
// big-endian), the client ID, the packet ID (2 bytes big-endian): a
// session's commands are one range of keys.
func commandKey(clientID string, packetID uint16) []byte {
	return binary.BigEndian.AppendUint16(commandPrefix(clientID), packetID)
}

func commandPrefix(clientID string) []byte {
	k := make([]byte, 0, 4+len(clientID))
	k = binary.BigEndian.AppendUint16(k, uint16(len(clientID)))
	return append(k, clientID...)
}

// PutSession stores rec as clientID's kept session, replacing the one
// before and keeping the commands queued in it; durable when it
// returns nil. Sessions stored at once (devices connecting together)
// share a transaction and its fsync (bbolt's Batch).
func (s *Store) PutSession(clientID string, rec []byte) error {
	if clientID == "" || len(clientID) > 0xffff {
		return fmt.Errorf("kept session: a client ID of %d bytes", len(clientID))
	}
	if s.closed.Load() {
		return ErrClosed
	}
	err := guard(func() error {
		return closedErr(s.db.Batch(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists(bucketSessions)
			if err != nil {
				return err
			}
			return b.Put([]byte(clientID), rec) // again if Batch runs it again: the same
		}))
	})
	s.health.note(err, unknownSize, time.Now, s.log, s.path)
	return err
}

// DeleteSession removes clientID's kept session and the commands queued
// in it; a missing one is not an error.
func (s *Store) DeleteSession(clientID string) error {
	return s.update(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketSessions); b != nil {
			if err := b.Delete([]byte(clientID)); err != nil {
				return err
			}
		}
		b := tx.Bucket(bucketCommands)
		if b == nil {
			return nil
		}
		prefix := commandPrefix(clientID)
		c := b.Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Seek(prefix) {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}

// PutCommand stores rec, a command queued in clientID's kept session
// under packetID; durable when it returns nil.
func (s *Store) PutCommand(clientID string, packetID uint16, rec []byte) error {
	if clientID == "" || len(clientID) > 0xffff {
		return fmt.Errorf("queued command: a client ID of %d bytes", len(clientID))
	}
	return s.update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketCommands)
		if err != nil {
			return err
		}
		return b.Put(commandKey(clientID, packetID), rec)
	})
}

// DeleteCommand removes the command queued in clientID's session under
// packetID (acknowledged, or dropped); a missing one is not an error.
func (s *Store) DeleteCommand(clientID string, packetID uint16) error {
	return s.update(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketCommands); b != nil {
			return b.Delete(commandKey(clientID, packetID))
		}
		return nil
	})
}

// LoadSessions calls session for every kept session, then command for
// every queued command, a session's in packet ID order; rec is valid
// only during the call. A key that does not decode is ErrCorrupt.
func (s *Store) LoadSessions(session func(clientID string, rec []byte) error, command func(clientID string, packetID uint16, rec []byte) error) error {
	return s.view(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketSessions); b != nil {
			if err := b.ForEach(func(k, v []byte) error { return session(string(k), v) }); err != nil {
				return err
			}
		}
		b := tx.Bucket(bucketCommands)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			if len(k) < 4 || int(binary.BigEndian.Uint16(k))+4 != len(k) {
				return fmt.Errorf("%w: queued command key %s", ErrCorrupt, keyName(k))
			}
			n := len(k) - 2
			return command(string(k[2:n]), binary.BigEndian.Uint16(k[n:]), v)
		})
	})
}
