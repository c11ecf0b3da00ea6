package persist

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/varint"
)

// The lease log. A lease write (Leaser.write) does not merge each of
// its records into its window's record in "leases": that put its keys
// at random places in the B-tree, and bbolt reads every leaf page a
// transaction touches into memory and writes it anew, so each of the
// thousands of small lease writes of a connection storm, and each
// lazy write of a quiet fleet, rewrote pages of the whole bucket (make
// bench-lease: lease writes added some 40 % to the gateway's
// allocations in the ramp of 10,000 devices, and the collections that
// came with them stalled deliveries; docs/durability.md). It appends
// its batch as one value under the next sequence number of
// "lease-log", one leaf page at the end of a bucket. Once the log holds
// more entries than foldLeaseLogAt or than "leases" holds records,
// whichever is more, each write also folds the log's oldest values
// into "leases" (foldLeaseLog, Leaser.write), so a record is merged
// about once per window per pass however often its window takes a
// lease; SettleLeases folds what is left before it reads.
//
// Folding a lease write later than it committed changes nothing a
// crash is charged: the merge is free of order between lease writes
// and a snapshot's marks and deletions (leases.go), which go into
// "leases" directly, as if the write had committed when it is folded.
// The log keeps the lease writes' own order.
//
// A value is a run of entries, each: the key as a uvarint length and
// its bytes (the device's own key, however long: long keys go to
// "leases-long" when folded), then as uvarints the incarnation, the cap,
// the window's length in nanoseconds, the admissions at the write and
// the length of the window's encoding, then that encoding.
var bucketLeaseLog = []byte("lease-log")

// foldLeaseLogAt is the fewest entries the lease log holds before a
// lease write folds it: at make bench-lease's 1,900 lease records a
// second, a folding every 8 s or so.
const foldLeaseLogAt = 16384

// appendLogEntry appends the log entry of a lease write of key to b.
func appendLogEntry(b []byte, key string, l devicelimit.Lease) []byte {
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	for _, x := range [...]uint64{l.Inc, l.Cap, uint64(l.Length), l.Adm, uint64(len(l.Window))} {
		b = binary.AppendUvarint(b, x)
	}
	return append(b, l.Window...)
}

// decodeLogEntry decodes the first entry of v: its key, the lease
// write and the rest of v. The key and the window are slices of v.
func decodeLogEntry(v []byte) (key []byte, l leaseRecord, rest []byte, err error) {
	n, k := varint.Uvarint(v)
	if k <= 0 || n > uint64(len(v)-k) {
		return nil, l, nil, fmt.Errorf("%w: lease log entry: truncated key", ErrCorrupt)
	}
	key, v = v[k:k+int(n)], v[k+int(n):]
	var f [5]uint64
	for i := range f {
		x, k := varint.Uvarint(v)
		if k <= 0 {
			return nil, l, nil, fmt.Errorf("%w: lease log entry of %s: truncated", ErrCorrupt, keyName(key))
		}
		f[i], v = x, v[k:]
	}
	if f[2] > uint64(devicelimit.MaxWindow) || f[4] > uint64(len(v)) {
		return nil, l, nil, fmt.Errorf("%w: lease log entry of %s: malformed", ErrCorrupt, keyName(key))
	}
	l = leaseRecord{inc: f[0], cap: f[1], length: time.Duration(f[2]), adm: f[3]}
	if f[4] > 0 {
		l.window = v[:f[4]:f[4]]
	}
	return key, l, v[f[4]:], nil
}

// appendLeaseLog puts value, a batch of log entries, in the lease log
// of tx under its next sequence number.
func appendLeaseLog(tx *bolt.Tx, value []byte) error {
	b, err := tx.CreateBucketIfNotExists(bucketLeaseLog)
	if err != nil {
		return err
	}
	b.FillPercent = 1 // appended to at its end only
	seq, err := b.NextSequence()
	if err != nil {
		return err
	}
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return b.Put(k[:], value)
}

// foldLeaseLog merges the lease writes of the lease log into "leases"
// (leaseTx.merge) in the order they were appended, its oldest values
// first, until limit entries or more are folded (limit < 0: all of
// them), and deletes the values folded (and the log once they are all
// folded). It returns the entries folded and the records it added to
// "leases".
func foldLeaseLog(tx *bolt.Tx, limit int) (entries, added int, err error) {
	log := tx.Bucket(bucketLeaseLog)
	if log == nil {
		return 0, 0, nil
	}
	lt := leaseTx{tx: tx}
	var done [][]byte // the keys of the values folded
	c := log.Cursor()
	k, v := c.First()
	for ; k != nil && (limit < 0 || entries < limit); k, v = c.Next() {
		if v == nil || len(k) != 8 {
			return 0, 0, fmt.Errorf("%w: lease log: key %x is not a sequence number", ErrCorrupt, k)
		}
		for len(v) > 0 {
			key, l, rest, err := decodeLogEntry(v)
			if err != nil {
				return 0, 0, fmt.Errorf("lease log record %d: %w", binary.BigEndian.Uint64(k), err)
			}
			v = rest
			created, err := lt.mergeCounted(string(key), l, leaseWrite)
			if err != nil {
				return 0, 0, err
			}
			entries++
			if created {
				added++
			}
		}
		done = append(done, bytes.Clone(k))
	}
	if k == nil {
		return entries, added, tx.DeleteBucket(bucketLeaseLog)
	}
	// Deleted after the walk: a cursor that deletes as it goes skips.
	for _, k := range done {
		if err := log.Delete(k); err != nil {
			return 0, 0, err
		}
	}
	return entries, added, nil
}
