package forward

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/devicegate/devicegate/internal/recsum"
)

// Message is one device message on its way upstream.
type Message struct {
	Device  string    // the client ID that published it
	At      time.Time // when the gateway accepted it; zero when unknown (records of version 1)
	Topic   string    // the local topic
	QoS     byte
	Retain  bool
	Payload []byte
	Props   *Props // MQTT 5 properties carried upstream; nil when none
	// ID identifies the message ("ORIGIN/LOG/SEQ", Config.Origin): a
	// message sent again after an outage or a restart carries the same
	// ID, and no other message ever does (a log never reuses a number),
	// so a destination or a reader can drop the duplicate. Set when the
	// message is read from the log, from its number; a dead letter
	// replayed keeps the ID it had, stored in its record (flagID).
	ID string
}

// Props are the MQTT 5 PUBLISH properties a message carries upstream
// (the ones that belong to the message, not to one hop: no topic alias,
// no subscription identifier).
type Props struct {
	PayloadFormat    byte // 0 bytes, 1 UTF-8; only when HasPayloadFormat
	HasPayloadFormat bool
	MessageExpiry    uint32 // seconds; 0: none
	ContentType      string
	ResponseTopic    string
	CorrelationData  []byte
	User             []UserProperty
}

// UserProperty is one MQTT 5 user property.
type UserProperty struct{ Key, Value string }

// A forward log record of version 2: version (2), flags (QoS in the low
// two bits, retain in bit 2, properties in bit 3, an ID in bit 4), the
// acceptance time in Unix milliseconds (uvarint), the device and the
// topic (each a uvarint length and the bytes), the ID when flagged (a
// replayed dead letter's: Message.ID), the properties when flagged,
// then the payload.
// Version 1 (written before version 2 existed) had no time, device or
// properties: version, flags, topic, payload. Both are read.
//
// Version 3 is version 2 with a checksum: version (3), the CRC-32C
// (Castagnoli) of the record's sequence number in its log (8 bytes,
// big-endian) followed by the rest of the record, 4 bytes big-endian
// (internal/recsum, with no name), then version 2's fields from the
// flags on. A damaged byte anywhere,
// in the record or in its key, fails the check (checkRecord).
const (
	recordV1 = 1
	recordV2 = 2
	recordV3 = 3

	crcLen = recsum.Len

	maxMillis = 253402300799999 // 9999-12-31T23:59:59.999Z

	flagRetain = 4
	flagProps  = 8
	flagID     = 16
)

// appendRecord appends m's record to b.
func appendRecord(b []byte, m *Message) []byte {
	flags := m.QoS & 3
	if m.Retain {
		flags |= flagRetain
	}
	if m.Props != nil {
		flags |= flagProps
	}
	if m.ID != "" {
		flags |= flagID
	}
	var ms uint64
	if !m.At.IsZero() {
		ms = uint64(max(m.At.UnixMilli(), 0))
	}
	b = append(b, recordV3, 0, 0, 0, 0, flags) // the checksum: seal
	b = binary.AppendUvarint(b, ms)
	b = appendString(b, m.Device)
	b = appendString(b, m.Topic)
	if m.ID != "" {
		b = appendString(b, m.ID)
	}
	if p := m.Props; p != nil {
		pf := byte(0xff)
		if p.HasPayloadFormat {
			pf = p.PayloadFormat
		}
		b = append(b, pf)
		b = binary.AppendUvarint(b, uint64(p.MessageExpiry))
		b = appendString(b, p.ContentType)
		b = appendString(b, p.ResponseTopic)
		b = appendString(b, string(p.CorrelationData))
		b = binary.AppendUvarint(b, uint64(len(p.User)))
		for _, u := range p.User {
			b = appendString(b, u.Key)
			b = appendString(b, u.Value)
		}
	}
	return append(b, m.Payload...)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// recordReader reads a record's fields in order; the first failure
// sticks.
type recordReader struct {
	b   []byte
	err error
}

func (r *recordReader) uvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("forward record: bad %s", what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *recordReader) bytes(what string) []byte {
	n := r.uvarint(what + " length")
	if r.err != nil {
		return nil
	}
	if uint64(len(r.b)) < n {
		r.err = fmt.Errorf("forward record: %s of %d bytes, %d left", what, n, len(r.b))
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// seal writes the checksum of rec, a record of version 3 (appendRecord)
// numbered seq in its log.
func seal(rec []byte, seq uint64) { recsum.Seal(rec, "", seq) }

// errDamaged is checkRecord's error: the record is not what was
// written.
var errDamaged = errors.New("forward record damaged: its checksum does not match")

// checkRecord verifies the checksum of rec, numbered seq in its log;
// records of versions 1 and 2 have none and pass.
func checkRecord(seq uint64, rec []byte) error {
	if len(rec) == 0 || rec[0] != recordV3 {
		return nil
	}
	if len(rec) < 2+crcLen || !recsum.Check(rec, "", seq) {
		return errDamaged
	}
	return nil
}

// decodeRecord reads a record of version 1, 2 or 3 (without checking a
// checksum: checkRecord). The payload and the correlation data share
// b's memory.
func decodeRecord(b []byte) (Message, error) {
	version := byte(0)
	if len(b) > 0 {
		version = b[0]
	}
	if version == recordV3 {
		// Version 2's fields after the checksum.
		if len(b) < 3+crcLen {
			return Message{}, errors.New("forward record cut short")
		}
		b = b[crcLen:]
	}
	if len(b) < 3 || (version != recordV1 && version != recordV2 && version != recordV3) {
		return Message{}, errors.New("not a forward record of version 1, 2 or 3")
	}
	flags := b[1]
	m := Message{QoS: flags & 3, Retain: flags&flagRetain != 0}
	r := recordReader{b: b[2:]}
	if version != recordV1 {
		if ms := r.uvarint("time"); ms > maxMillis {
			return Message{}, fmt.Errorf("forward record: time %d ms is past the year 9999", ms)
		} else if ms > 0 {
			m.At = time.UnixMilli(int64(ms))
		}
		m.Device = string(r.bytes("device"))
	}
	m.Topic = string(r.bytes("topic"))
	if version != recordV1 && flags&flagID != 0 {
		m.ID = string(r.bytes("id"))
	}
	if version != recordV1 && flags&flagProps != 0 {
		if len(r.b) == 0 {
			return Message{}, errors.New("forward record: properties cut short")
		}
		p := &Props{}
		if pf := r.b[0]; pf != 0xff {
			p.PayloadFormat, p.HasPayloadFormat = pf, true
		}
		r.b = r.b[1:]
		p.MessageExpiry = uint32(r.uvarint("message expiry"))
		p.ContentType = string(r.bytes("content type"))
		p.ResponseTopic = string(r.bytes("response topic"))
		if cd := r.bytes("correlation data"); len(cd) > 0 {
			p.CorrelationData = cd
		}
		n := r.uvarint("user property count")
		if r.err == nil && n > uint64(len(r.b)) {
			return Message{}, fmt.Errorf("forward record: %d user properties in %d bytes", n, len(r.b))
		}
		for i := uint64(0); i < n && r.err == nil; i++ {
			p.User = append(p.User, UserProperty{string(r.bytes("user property key")), string(r.bytes("user property value"))})
		}
		m.Props = p
	}
	if r.err != nil {
		return Message{}, r.err
	}
	m.Payload = r.b
	return m, nil
}
