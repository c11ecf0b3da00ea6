package simulator

import (
	"encoding/binary"
	"fmt"
	"time"
)

// Header is what every simulated message carries at the start of its
// payload, so that the subscriber can attribute an arrival without
// trusting the topic.
//
// Encoding (big endian): magic "DGS1", seq uint64, send time as Unix
// nanoseconds int64, device ID length uint16, device ID bytes; any
// padding after that is ignored.
type Header struct {
	Device string
	Seq    uint64
	Sent   time.Time
}

var magic = [4]byte{'D', 'G', 'S', '1'}

// headerFixed is the size of a header without its device ID.
const headerFixed = 4 + 8 + 8 + 2

// AppendHeader appends h's encoding to b, then zero padding up to size
// bytes in all when size is larger than the header.
func AppendHeader(b []byte, h Header, size int) []byte {
	start := len(b)
	b = append(b, magic[:]...)
	b = binary.BigEndian.AppendUint64(b, h.Seq)
	b = binary.BigEndian.AppendUint64(b, uint64(h.Sent.UnixNano()))
	b = binary.BigEndian.AppendUint16(b, uint16(len(h.Device)))
	b = append(b, h.Device...)
	for len(b)-start < size {
		b = append(b, 0)
	}
	return b
}

// DecodeHeader reads the header at the start of p.
func DecodeHeader(p []byte) (Header, error) {
	if len(p) < headerFixed || [4]byte(p[:4]) != magic {
		return Header{}, ErrBadPayload
	}
	seq := binary.BigEndian.Uint64(p[4:])
	ns := int64(binary.BigEndian.Uint64(p[12:]))
	n := int(binary.BigEndian.Uint16(p[20:]))
	if len(p) < headerFixed+n {
		return Header{}, fmt.Errorf("%w: device ID of %d bytes, %d left", ErrBadPayload, n, len(p)-headerFixed)
	}
	return Header{Device: string(p[headerFixed : headerFixed+n]), Seq: seq, Sent: time.Unix(0, ns)}, nil
}
