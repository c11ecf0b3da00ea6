package persist

import (
	"encoding/binary"

	"github.com/devicegate/devicegate/devicelimit"
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

// overrideVersion is the first byte of an encoded override of one
// window; overrideWindows that of one of several.
const (
	overrideVersion = 1
	overrideWindows = 2
	overrideClasses = 3
)

// appendOverride appends the encoding of o to b: version 1, then the
// limit and the window in nanoseconds as uvarints, the policy as one
// byte, and the expiry tick as a varint (0: never). An override of
// several windows is version 2: the policy byte, the expiry varint, the
// number of windows (one byte), then per window its unit (one byte: 0
// messages, 1 bytes), limit and length in nanoseconds as uvarints. An
// override of one window is still written as version 1, which every
// gateway reads. An override with topic classes or in shadow mode is
// version 3: its JSON form (devicelimit.MarshalOverride). o must be
// valid.
func appendOverride(b []byte, o devicelimit.Override) []byte {
	if o.NeedsJSON() {
		return append(append(b, overrideClasses), devicelimit.MarshalOverride(o)...)
	}
	if n := o.Quota.NWindows; n > 0 {
		b = append(b, overrideWindows, byte(o.Quota.Policy))
		b = binary.AppendVarint(b, int64(o.ExpiresAt))
		return devicelimit.AppendLimits(b, o.Quota.Windows[:n])
	}
	b = append(b, overrideVersion)
	b = binary.AppendUvarint(b, uint64(o.Quota.Limit))
	b = binary.AppendUvarint(b, uint64(o.Quota.Window))
	b = append(b, byte(o.Quota.Policy))
	return binary.AppendVarint(b, int64(o.ExpiresAt))
}
