package persist

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/varint"
)

// MaxDeferredDevice is the longest device ID, in bytes, whose messages
// can be deferred: a deferred message's key (the ID's length as a
// uvarint of up to 10 bytes, the ID and an 8-byte sequence number) must
// fit a bbolt key (bbolt.MaxKeySize).
const MaxDeferredDevice = bolt.MaxKeySize - binary.MaxVarintLen64 - 8

// deleteChunk is the most keys DeleteDeferred deletes in one transaction.
// Deletions share the group commit with enqueues, which wait for them: a
// chunk of 10,000 takes about 8 ms (BenchmarkDeleteDeferred), as long as
// a snapshot makes waiting enqueues wait (yieldAfter).
const deleteChunk = 10_000

// DeferredKey names one deferred message: the device and its per-device
// sequence number. It is an alias of an unnamed struct type, so a package
// that must not import persist (the broker) can declare the same type
// and use a *Store as its store without an adapter.
type DeferredKey = struct {
	Device string
	Seq    uint64
}

// Enqueue stores rec under (device, seq) durably: it returns only after
// the transaction holding it has been committed and fsynced. Concurrent
// calls share transactions and fsyncs (group commit). An error means
// nothing was stored, with one exception no store can rule out: when the
// fsync itself fails, a crash right after may still leave the record in
// the file, to be released as a duplicate (release is at-least-once
// anyway).
//
// A record already stored under (device, seq) is replaced. rec is not
// retained after Enqueue returns and must not change during the call.
// A device ID that is empty or longer than MaxDeferredDevice fails with
// an error wrapping devicelimit.ErrInvalidDevice, and a closed store
// with ErrClosed; pending calls of a store being closed complete before
// Close returns.
func (s *Store) Enqueue(device string, seq uint64, rec []byte) error {
	if err := validDeferredDevice(device); err != nil {
		return fmt.Errorf("enqueue deferred message %d of device %s: %w", seq, keyName([]byte(device)), err)
	}
	if int64(len(rec)) > bolt.MaxValueSize {
		return fmt.Errorf("enqueue deferred message %d of device %s: %d bytes, the store keeps at most %d", seq, keyName([]byte(device)), len(rec), int64(bolt.MaxValueSize))
	}
	r := requests.Get().(*request)
	r.log = nil
	r.key = appendDeferredKey(r.key[:0], device, seq)
	r.rec = rec
	err := s.commit.do(r)
	r.rec = nil
	if cap(r.key) <= 256 {
		requests.Put(r)
	}
	if err != nil {
		return fmt.Errorf("enqueue deferred message %d of device %s to %q: %w", seq, keyName([]byte(device)), s.path, err)
	}
	return nil
}

// DeleteDeferred removes released or expired messages durably, in one
// transaction shared with concurrent enqueues, or in transactions of
// 10,000 keys when there are more. Missing keys, and keys that cannot
// name a stored message (an invalid device ID), are not an error. On
// error, the transactions already committed stay: the keys they deleted
// are gone, and calling again with the same keys completes the deletion.
func (s *Store) DeleteDeferred(keys []DeferredKey) error {
	if s.closed.Load() {
		return fmt.Errorf("delete deferred messages from %q: %w", s.path, ErrClosed)
	}
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), s.delChunk)]
		keys = keys[len(chunk):]
		// One buffer for the chunk's keys, sized first so that
		// appending never moves the keys already in it.
		size := 0
		for _, k := range chunk {
			size += varint.UvarintLen(uint64(len(k.Device))) + len(k.Device) + 8
		}
		buf := make([]byte, 0, size)
		dels := make([][]byte, 0, len(chunk))
		for _, k := range chunk {
			if validDeferredDevice(k.Device) != nil {
				continue // never stored
			}
			start := len(buf)
			buf = appendDeferredKey(buf, k.Device, k.Seq)
			dels = append(dels, buf[start:len(buf):len(buf)])
		}
		if len(dels) == 0 {
			continue
		}
		if err := s.commit.do(&request{dels: dels, done: make(chan error, 1)}); err != nil {
			return fmt.Errorf("delete %d deferred messages from %q: %w", len(dels), s.path, err)
		}
	}
	return nil
}

// LoadDeferred calls fn for every stored deferred message, grouped by
// device and in increasing seq within a device. rec is valid only during
// the call. An error from fn stops the load and is returned wrapped. A
// malformed key is an error wrapping ErrCorrupt naming the file. Use it
// at start-up: it reads the file in one read transaction.
func (s *Store) LoadDeferred(fn func(device string, seq uint64, rec []byte) error) error {
	err := s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketDeferred)
		if b == nil {
			return nil
		}
		var device string
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			dev, seq, err := decodeDeferredKey(k)
			if err != nil {
				return fmt.Errorf("deferred key %s: %w", keyName(k), err)
			}
			if v == nil {
				return fmt.Errorf("%w: deferred key %s: a bucket, not a message", ErrCorrupt, keyName(k))
			}
			if string(dev) != device { // no allocation for the comparison
				device = string(dev)
			}
			if err := fn(device, seq, v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("load deferred messages from %q: %w", s.path, err)
	}
	return nil
}

// DeferredStats returns the number of stored deferred messages and the
// sum of their records' lengths. It reads every key, in one read
// transaction.
func (s *Store) DeferredStats() (messages int, bytes int64, err error) {
	err = s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketDeferred)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if v != nil { // not a bucket, which only a damaged file holds
				messages++
				bytes += int64(len(v))
			}
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("deferred stats of %q: %w", s.path, err)
	}
	return messages, bytes, nil
}

// validDeferredDevice checks that device can name deferred messages: a
// device's queue, or one of its classes' (the device ID, a NUL and the
// class: any bytes but none).
func validDeferredDevice(device string) error {
	if device == "" {
		return &devicelimit.FieldError{Field: "device", Msg: "must not be empty", Err: devicelimit.ErrInvalidDevice}
	}
	if len(device) > MaxDeferredDevice {
		return fmt.Errorf("%w: %d bytes, deferred messages are kept for IDs of at most %d", devicelimit.ErrInvalidDevice, len(device), MaxDeferredDevice)
	}
	return nil
}

// appendDeferredKey appends the key of (device, seq) to b: the device
// ID's length as a uvarint, the ID, and seq as 8 bytes big-endian. The
// length prefix keeps a device's keys contiguous (no ID's keys fall
// between those of another, even one it is a prefix of), and the
// big-endian seq orders them.
func appendDeferredKey(b []byte, device string, seq uint64) []byte {
	b = binary.AppendUvarint(b, uint64(len(device)))
	b = append(b, device...)
	return binary.BigEndian.AppendUint64(b, seq)
}

// decodeDeferredKey decodes a key made by appendDeferredKey for a valid
// device ID. device points into k.
func decodeDeferredKey(k []byte) (device []byte, seq uint64, err error) {
	l, n := varint.Uvarint(k)
	switch {
	case n <= 0:
		return nil, 0, fmt.Errorf("%w: truncated or malformed device length", ErrCorrupt)
	case l == 0:
		return nil, 0, fmt.Errorf("%w: empty device ID", ErrCorrupt)
	case l > MaxDeferredDevice:
		return nil, 0, fmt.Errorf("%w: device ID of %d bytes, at most %d", ErrCorrupt, l, MaxDeferredDevice)
	case uint64(len(k)-n) != l+8:
		return nil, 0, fmt.Errorf("%w: %d bytes after the length, want %d for the ID and the sequence number", ErrCorrupt, len(k)-n, l+8)
	}
	end := n + int(l)
	return k[n:end:end], binary.BigEndian.Uint64(k[end:]), nil
}
