package persist

import (
	"encoding/binary"

	"devicegate/devicelimit"
)

// Meta keys and values. The schema version is a uvarint, the clock
// high-water an 8-byte big-endian int64, the clean-shutdown flag one
// byte, 0 or 1.
var (
	keySchema = []byte("schema")
	keyClock  = []byte("clock")
	keyClean  = []byte("clean")
)

func encodeSchema(v int) []byte { return binary.AppendUvarint(nil, uint64(v)) }

func encodeClock(t devicelimit.Tick) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(t))
}

func encodeClean(clean bool) []byte {
	if clean {
		return []byte{1}
	}
	return []byte{0}
}

// overrideVersion is the first byte of an encoded override.
const overrideVersion = 1

// appendOverride appends the encoding of o to b: version 1, then the
// limit and the window in nanoseconds as uvarints, the policy as one
// byte, and the expiry tick as a varint (0: never). o must be valid.
func appendOverride(b []byte, o devicelimit.Override) []byte {
	b = append(b, overrideVersion)
	b = binary.AppendUvarint(b, uint64(o.Quota.Limit))
	b = binary.AppendUvarint(b, uint64(o.Quota.Window))
	b = append(b, byte(o.Quota.Policy))
	return binary.AppendVarint(b, int64(o.ExpiresAt))
}
