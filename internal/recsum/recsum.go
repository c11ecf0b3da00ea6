// Package recsum is the checksum of the gateway's stored records, the
// forward logs' (forward/record.go) and the deferral queue's
// (broker/record.go): one piece of code for both.
//
// A checksummed record starts with a version byte, then the checksum,
// Len bytes big-endian, then the rest of the record. The checksum is the
// CRC-32C (Castagnoli) of the name the record is stored under (empty for
// a forward log's record), its sequence number (8 bytes, big-endian) and
// the rest of the record: a damaged byte anywhere in the record, or in
// the key it is read back under, fails Check.
package recsum

import (
	"encoding/binary"
	"hash/crc32"
	"unsafe"
)

// Len is the checksum's length in a record, after the version byte.
const Len = 4

// Header is the bytes before the rest of a record: the version and the
// checksum.
const Header = 1 + Len

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Seal writes the checksum of rec, stored under name and seq, into
// rec[1:Header]. rec must hold at least Header bytes.
func Seal(rec []byte, name string, seq uint64) {
	binary.BigEndian.PutUint32(rec[1:Header], sum(rec, name, seq))
}

// Check reports whether rec, read back under name and seq, holds the
// checksum Seal wrote: false when it is shorter than Header.
func Check(rec []byte, name string, seq uint64) bool {
	return len(rec) >= Header && binary.BigEndian.Uint32(rec[1:Header]) == sum(rec, name, seq)
}

func sum(rec []byte, name string, seq uint64) uint32 {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	// The name's bytes read in place: crc32 only reads them, and a
	// conversion would allocate for names over 32 bytes.
	c := crc32.Update(0, castagnoli, unsafe.Slice(unsafe.StringData(name), len(name)))
	c = crc32.Update(c, castagnoli, k[:])
	return crc32.Update(c, castagnoli, rec[Header:])
}
