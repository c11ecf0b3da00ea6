package varint

import (
	"encoding/binary"
	"math"
	"testing"
)

// TestOneForm: every value decodes from its shortest encoding, and a
// longer encoding of the same value (a continuation byte of zeros) is
// refused, as a truncated one is.
func TestOneForm(t *testing.T) {
	for _, v := range []uint64{0, 1, 127, 128, 300, 1 << 32, math.MaxUint64} {
		b := binary.AppendUvarint(nil, v)
		if got, n := Uvarint(b); got != v || n != len(b) || n != UvarintLen(v) {
			t.Errorf("Uvarint(% x) = %d, %d; want %d, %d", b, got, n, v, len(b))
		}
		if len(b) < binary.MaxVarintLen64 {
			long := append(append([]byte{}, b[:len(b)-1]...), b[len(b)-1]|0x80, 0)
			if _, n := Uvarint(long); n != 0 {
				t.Errorf("Uvarint(% x), an overlong %d: n = %d, want 0", long, v, n)
			}
		}
		if _, n := Uvarint(b[:len(b)-1]); len(b) > 1 && n != 0 {
			t.Errorf("truncated % x: n = %d, want 0", b[:len(b)-1], n)
		}
	}
	for _, v := range []int64{0, -1, 1, math.MinInt64, math.MaxInt64} {
		b := binary.AppendVarint(nil, v)
		if got, n := Varint(b); got != v || n != len(b) {
			t.Errorf("Varint(% x) = %d, %d; want %d", b, got, n, v)
		}
	}
}
