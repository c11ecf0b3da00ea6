package persist

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/internal/varint"
)

// Device IDs longer than bbolt.MaxKeySize cannot be keys. Their windows
// and overrides live in buckets of their own, "windows-long" and
// "overrides-long", keyed by the SHA-256 of the ID; the value is the ID's
// length as a uvarint, the ID, then the usual encoding. Short IDs never
// go there, so a short ID equal to some hash cannot collide with a long
// one. The buckets are created by the first write; a file without them
// reads as holding none.
var (
	bucketWindowsLong   = []byte("windows-long")
	bucketOverridesLong = []byte("overrides-long")
)

// longID reports whether device is too long to be a bbolt key.
func longID(device string) bool { return len(device) > bolt.MaxKeySize }

// longKey returns the key of a long device ID.
func longKey(device string) []byte {
	h := sha256.Sum256([]byte(device))
	return h[:]
}

// appendLongValue appends the uvarint length of device, device and enc.
func appendLongValue(b []byte, device string, enc []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(device)))
	b = append(b, device...)
	return append(b, enc...)
}

// decodeLongValue splits a long bucket's value stored under key into the
// device ID and the encoding, checking that the ID is long and hashes to
// key.
func decodeLongValue(key, v []byte) (device, enc []byte, err error) {
	if v == nil {
		return nil, nil, fmt.Errorf("%w: key %x: a bucket, not a record", ErrCorrupt, key)
	}
	l, n := varint.Uvarint(v)
	switch {
	case n <= 0:
		return nil, nil, fmt.Errorf("%w: key %x: malformed device ID length", ErrCorrupt, key)
	case l > uint64(len(v)-n):
		return nil, nil, fmt.Errorf("%w: key %x: truncated device ID", ErrCorrupt, key)
	case l <= bolt.MaxKeySize:
		return nil, nil, fmt.Errorf("%w: key %x: device ID of %d bytes among the long ones", ErrCorrupt, key, l)
	}
	device = v[n : n+int(l)]
	if h := sha256.Sum256(device); string(h[:]) != string(key) {
		return nil, nil, fmt.Errorf("%w: device %s: stored under key %x, not its hash", ErrCorrupt, keyName(device), key)
	}
	return device, v[n+int(l):], nil
}

// longBucket returns tx's bucket name, creating it when create is set;
// it is nil when absent and not created.
func longBucket(tx *bolt.Tx, name []byte, create bool) (*bolt.Bucket, error) {
	if b := tx.Bucket(name); b != nil || !create {
		return b, nil
	}
	return tx.CreateBucket(name)
}
