// Package varint decodes the uvarints and varints of the gateway's
// stored records strictly: an encoding longer than its value needs is
// refused, so every record has exactly one form.
package varint

import (
	"encoding/binary"
	"math/bits"
)

// Uvarint is binary.Uvarint that also refuses an encoding longer than
// the value needs (n == 0 then, as for a truncated one), so every
// encoded record (the store's and the deferral queue's; devicelimit
// keeps its own for window snapshots) has exactly one form.
func Uvarint(b []byte) (v uint64, n int) {
	v, n = binary.Uvarint(b)
	if n > 0 && n != UvarintLen(v) {
		return 0, 0
	}
	return v, n
}

// Varint is binary.Varint with Uvarint's refusal of longer encodings.
func Varint(b []byte) (int64, int) {
	u, n := Uvarint(b)
	return int64(u>>1) ^ -int64(u&1), n // zig-zag, as binary.Varint
}

// UvarintLen is the length of v's shortest uvarint encoding, the one
// binary.AppendUvarint writes.
func UvarintLen(v uint64) int { return max(1, (bits.Len64(v)+6)/7) }
