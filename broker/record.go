package broker

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/recsum"
	"github.com/devicegate/devicegate/internal/varint"
)

// deferredMsg is a message held in the deferral queue: what the release
// needs to publish it as the device sent it, and to count it against the
// device's quota when the device may no longer be connected.
type deferredMsg struct {
	// Enqueued is when the message was deferred (logical clock).
	Enqueued devicelimit.Tick
	// Quota is the device's rule (or default) quota at enqueue time;
	// overrides are looked up again at release.
	Quota devicelimit.Quota
	// Version is the publisher's protocol version: 3 (3.1), 4 (3.1.1) or 5.
	Version byte
	QoS     byte
	Retain  bool
	Topic   string
	Payload []byte

	// MQTT 5 properties kept for the subscribers.
	PayloadFormat     byte
	PayloadFormatFlag bool
	// MessageExpiry is the message expiry interval in seconds as
	// published; 0 means none.
	MessageExpiry   uint32
	ContentType     string
	ResponseTopic   string
	CorrelationData []byte
	User            []packets.UserProperty

	// Released, when not 0, is the instant the message is released at,
	// sent as the user property devicelimit.ReleasedProperty (not
	// stored).
	Released devicelimit.Tick
}

// deferredVersion is the record format version, its first byte;
// deferredWindows that of a record whose quota has several windows;
// deferredSealed that of a checksummed record (sealDeferred), which
// holds a record of version 1 or 2.
const (
	deferredVersion = 1
	deferredWindows = 2
	deferredSealed  = 3
)

// Record flag bits.
const (
	flagRetain        = 1 << 0
	flagPayloadFormat = 1 << 1
	flagQoSShift      = 2
	flagQoSMask       = 3 << flagQoSShift
	flagKnown         = flagRetain | flagPayloadFormat | flagQoSMask
)

// deferredFromPacket is the one conversion of a device's publish into a
// deferral record's message, at now under the device's rule quota. A
// payload format without its flag is dropped, and a protocol version no
// network client can have becomes 4, so the record stays decodable.
func deferredFromPacket(pk *packets.Packet, version byte, now devicelimit.Tick, rule devicelimit.Quota) deferredMsg {
	m := deferredMsg{
		Enqueued:          now,
		Quota:             rule,
		Version:           version,
		QoS:               pk.FixedHeader.Qos,
		Retain:            pk.FixedHeader.Retain,
		Topic:             pk.TopicName,
		Payload:           pk.Payload,
		PayloadFormat:     pk.Properties.PayloadFormat,
		PayloadFormatFlag: pk.Properties.PayloadFormatFlag,
		MessageExpiry:     pk.Properties.MessageExpiryInterval,
		ContentType:       pk.Properties.ContentType,
		ResponseTopic:     pk.Properties.ResponseTopic,
		CorrelationData:   pk.Properties.CorrelationData,
		User:              pk.Properties.User,
	}
	if !m.PayloadFormatFlag {
		m.PayloadFormat = 0
	}
	if m.Version < 3 || m.Version > 5 {
		m.Version = 4
	}
	return m
}

// packet is the one conversion back: the publish a release injects, with
// the Message Expiry Interval left (expiry; 0: none).
func (m *deferredMsg) packet(expiry uint32) packets.Packet {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: m.QoS, Retain: m.Retain},
		TopicName:   m.Topic,
		Payload:     m.Payload,
		Properties: packets.Properties{
			PayloadFormat:         m.PayloadFormat,
			PayloadFormatFlag:     m.PayloadFormatFlag,
			MessageExpiryInterval: expiry,
			ContentType:           m.ContentType,
			ResponseTopic:         m.ResponseTopic,
			CorrelationData:       m.CorrelationData,
			User:                  m.User,
		},
	}
	if m.Released != 0 {
		// A copy: m.User's array is the decoded record's.
		pk.Properties.User = append(m.User[:len(m.User):len(m.User)], packets.UserProperty{
			Key: devicelimit.ReleasedProperty, Val: m.Released.Time().UTC().Format(time.RFC3339Nano)})
	}
	if m.QoS > 0 {
		pk.PacketID = 1 // required; an inline publish is never acked
	}
	return pk
}

// appendDeferred appends m's encoding to dst. Layout, version 1:
//
//	byte     version (1)
//	varint   enqueued tick
//	uvarint  quota limit
//	uvarint  quota window, nanoseconds
//	byte     quota policy
//	byte     protocol version (3, 4 or 5)
//	byte     flags: bit 0 retain, bit 1 payload format indicator present,
//	         bits 2-3 QoS; the others zero
//	byte     payload format indicator (0 unless present)
//	uvarint  message expiry interval, seconds (0 none)
//	string   topic (uvarint length, bytes; never empty)
//	string   content type
//	string   response topic
//	bytes    correlation data
//	uvarint  number of user properties, then key and value strings
//	bytes    payload
//
// Nothing follows the payload. Every integer has its shortest encoding,
// so a record decodes to one message and encodes back to the same bytes.
//
// Version 2, for a quota of several windows, replaces the limit and the
// window by a byte with the number of windows (1 to 4) and per window a
// byte for its unit (0 messages, 1 bytes), its limit and its length in
// nanoseconds as uvarints; the rest is version 1's. A quota of one
// window is written as version 1, which every gateway reads.
func appendDeferred(dst []byte, m *deferredMsg) []byte {
	if n := m.Quota.NWindows; n > 0 {
		dst = append(dst, deferredWindows)
		dst = binary.AppendVarint(dst, int64(m.Enqueued))
		dst = devicelimit.AppendLimits(dst, m.Quota.Windows[:n])
	} else {
		dst = append(dst, deferredVersion)
		dst = binary.AppendVarint(dst, int64(m.Enqueued))
		dst = binary.AppendUvarint(dst, uint64(m.Quota.Limit))
		dst = binary.AppendUvarint(dst, uint64(m.Quota.Window))
	}
	dst = append(dst, byte(m.Quota.Policy), m.Version)
	flags := m.QoS << flagQoSShift
	if m.Retain {
		flags |= flagRetain
	}
	pf := byte(0)
	if m.PayloadFormatFlag {
		flags |= flagPayloadFormat
		pf = m.PayloadFormat
	}
	dst = append(dst, flags, pf)
	dst = binary.AppendUvarint(dst, uint64(m.MessageExpiry))
	dst = appendBytes(dst, m.Topic)
	dst = appendBytes(dst, m.ContentType)
	dst = appendBytes(dst, m.ResponseTopic)
	dst = appendBytes(dst, m.CorrelationData)
	dst = binary.AppendUvarint(dst, uint64(len(m.User)))
	for _, u := range m.User {
		dst = appendBytes(dst, u.Key)
		dst = appendBytes(dst, u.Val)
	}
	return appendBytes(dst, m.Payload)
}

// deferredRecord returns m's record as the queue stores it, exactly
// sized (the queue holds its records in memory, and MaxTotalBytes is
// meant to bound that memory): version 3, room for a checksum, then m's
// record of version 1 or 2 (appendDeferred). sealDeferred writes the
// checksum once the record's queue key and sequence number are known.
func deferredRecord(m *deferredMsg) []byte {
	rec := append(make([]byte, 0, recsum.Header+sizeDeferred(m)), deferredSealed, 0, 0, 0, 0)
	return appendDeferred(rec, m)
}

// sealDeferred writes the checksum of rec (deferredRecord), stored under
// the queue key key and sequence number seq (internal/recsum: the
// CRC-32C of the key, seq as 8 bytes big-endian and the record after
// the checksum). A damaged byte in the record or its key fails
// checkDeferred.
func sealDeferred(rec []byte, key string, seq uint64) { recsum.Seal(rec, key, seq) }

// checkDeferred verifies the checksum of rec, stored under the queue
// key key and sequence number seq. A record of version 1 or 2, written
// before records had checksums, has none and passes.
func checkDeferred(rec []byte, key string, seq uint64) error {
	if len(rec) > 0 && rec[0] == deferredSealed && !recsum.Check(rec, key, seq) {
		return fmt.Errorf("%w: its checksum does not match", ErrDamagedDeferred)
	}
	return nil
}

// deferredBody is the record of version 1 or 2 a stored record holds:
// rec itself, or what follows a checksummed record's header.
func deferredBody(rec []byte) []byte {
	if len(rec) > 0 && rec[0] == deferredSealed {
		return rec[min(recsum.Header, len(rec)):]
	}
	return rec
}

// decodeStored decodes a record as stored (deferredRecord): its body,
// behind the checksum when it has one. It does not verify the checksum
// (checkDeferred does, at start).
func decodeStored(rec []byte) (deferredMsg, error) { return decodeDeferred(deferredBody(rec)) }

// sizeDeferred returns the length of m's encoding.
func sizeDeferred(m *deferredMsg) int {
	quota := uvarintLen(uint64(m.Quota.Limit)) + uvarintLen(uint64(m.Quota.Window))
	if n := m.Quota.NWindows; n > 0 {
		quota = 1
		for _, l := range m.Quota.Windows[:n] {
			quota += 1 + uvarintLen(uint64(l.N)) + uvarintLen(uint64(l.Window))
		}
	}
	n := 1 + varintLen(int64(m.Enqueued)) + quota +
		4 + uvarintLen(uint64(m.MessageExpiry)) +
		bytesLen(m.Topic) + bytesLen(m.ContentType) + bytesLen(m.ResponseTopic) + bytesLen(m.CorrelationData) +
		uvarintLen(uint64(len(m.User))) + bytesLen(m.Payload)
	for _, u := range m.User {
		n += bytesLen(u.Key) + bytesLen(u.Val)
	}
	return n
}

func bytesLen[T string | []byte](b T) int { return uvarintLen(uint64(len(b))) + len(b) }

var uvarintLen = varint.UvarintLen

func varintLen(v int64) int { return uvarintLen(uint64(v<<1) ^ uint64(v>>63)) }

func appendBytes[T string | []byte](dst []byte, b T) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// decodeDeferred decodes a record written by appendDeferred. It accepts
// only the canonical encoding of a message the gateway could have
// deferred; anything else is an ErrBadDeferred. The message shares no
// memory with b.
func decodeDeferred(b []byte) (deferredMsg, error) {
	d := recDecoder{b: b}
	var m deferredMsg
	v := d.byte()
	if d.err == nil && v != deferredVersion && v != deferredWindows {
		return m, fmt.Errorf("%w: unknown version %d", ErrBadDeferred, v)
	}
	m.Enqueued = devicelimit.Tick(d.varint())
	var limit, window uint64
	var windows []devicelimit.Limit
	if v == deferredWindows {
		n := d.byte()
		if d.err == nil && (n < 1 || n > devicelimit.MaxWindows) {
			return m, fmt.Errorf("%w: %d windows", ErrBadDeferred, n)
		}
		windows = make([]devicelimit.Limit, n)
		for i := range windows {
			u, l, w := d.byte(), d.uvarint(), d.uvarint()
			if d.err == nil && (u > byte(devicelimit.Bytes) || l > devicelimit.MaxBytes || w > uint64(devicelimit.MaxWindow)) {
				return m, fmt.Errorf("%w: window %d out of range", ErrBadDeferred, i)
			}
			windows[i] = devicelimit.Limit{Unit: devicelimit.Unit(u), N: int(l), Window: time.Duration(w)}
		}
		limit, window = 1, 1 // checked per window below
	} else {
		limit, window = d.uvarint(), d.uvarint()
	}
	policy := devicelimit.Policy(d.byte())
	m.Version = d.byte()
	flags := d.byte()
	pf := d.byte()
	expiry := d.uvarint()
	m.Topic = d.string()
	m.ContentType = d.string()
	m.ResponseTopic = d.string()
	m.CorrelationData = d.bytes()
	if n := d.uvarint(); n > 0 && d.err == nil {
		if n > uint64(len(d.b)-d.off)/2 { // each property takes two bytes at least
			return m, fmt.Errorf("%w: %d user properties in %d bytes", ErrBadDeferred, n, len(d.b)-d.off)
		}
		m.User = make([]packets.UserProperty, n)
		for i := range m.User {
			m.User[i] = packets.UserProperty{Key: d.string(), Val: d.string()}
		}
	}
	m.Payload = d.bytes()
	switch {
	case d.err != nil:
		return m, d.err
	case d.off != len(d.b):
		return m, fmt.Errorf("%w: %d bytes after the payload", ErrBadDeferred, len(d.b)-d.off)
	case limit < 1 || limit > devicelimit.MaxLimit:
		return m, fmt.Errorf("%w: quota limit %d", ErrBadDeferred, limit)
	case window < 1 || window > uint64(devicelimit.MaxWindow):
		return m, fmt.Errorf("%w: quota window %d", ErrBadDeferred, window)
	case policy > devicelimit.PolicyDisconnect:
		return m, fmt.Errorf("%w: quota policy %d", ErrBadDeferred, policy)
	case m.Version < 3 || m.Version > 5:
		return m, fmt.Errorf("%w: protocol version %d", ErrBadDeferred, m.Version)
	case flags&^flagKnown != 0 || flags&flagQoSMask == flagQoSMask:
		return m, fmt.Errorf("%w: flags 0x%02x", ErrBadDeferred, flags)
	case flags&flagPayloadFormat == 0 && pf != 0:
		return m, fmt.Errorf("%w: payload format %d without its flag", ErrBadDeferred, pf)
	case expiry > math.MaxUint32:
		return m, fmt.Errorf("%w: message expiry %d", ErrBadDeferred, expiry)
	case m.Topic == "":
		return m, fmt.Errorf("%w: empty topic", ErrBadDeferred)
	}
	m.Quota = devicelimit.Quota{Limit: int(limit), Window: time.Duration(window), Policy: policy}
	if windows != nil {
		if err := devicelimit.ValidateLimits(windows, 1); err != nil {
			return m, fmt.Errorf("%w: %v", ErrBadDeferred, err)
		}
		m.Quota = devicelimit.WithWindows(policy, windows...)
	}
	m.QoS = (flags & flagQoSMask) >> flagQoSShift
	m.Retain = flags&flagRetain != 0
	m.PayloadFormatFlag = flags&flagPayloadFormat != 0
	m.PayloadFormat = pf
	m.MessageExpiry = uint32(expiry)
	return m, nil
}

// recDecoder reads a record; the first error sticks and later reads
// return zero values.
type recDecoder struct {
	b   []byte
	off int
	err error
}

func (d *recDecoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: bad %s at byte %d", ErrBadDeferred, what, d.off)
	}
}

func (d *recDecoder) byte() byte {
	if d.err != nil || d.off >= len(d.b) {
		d.fail("byte")
		return 0
	}
	d.off++
	return d.b[d.off-1]
}

func (d *recDecoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := varint.Uvarint(d.b[d.off:])
	if n <= 0 {
		d.fail("integer")
		return 0
	}
	d.off += n
	return v
}

func (d *recDecoder) varint() int64 {
	u := d.uvarint()
	return int64(u>>1) ^ -int64(u&1) // zig-zag, as binary.Varint
}

// bytes reads a length-prefixed byte string; empty is nil.
func (d *recDecoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)-d.off) {
		d.fail("length")
		return nil
	}
	if n == 0 {
		return nil
	}
	out := make([]byte, n)
	copy(out, d.b[d.off:])
	d.off += int(n)
	return out
}

func (d *recDecoder) string() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)-d.off) {
		d.fail("length")
		return ""
	}
	s := string(d.b[d.off : d.off+int(n)])
	d.off += int(n)
	return s
}
