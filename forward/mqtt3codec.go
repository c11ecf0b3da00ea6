package forward

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The MQTT 3.1.1 packets the forwarder's own client (mqtt3conn.go)
// writes and reads: their types, as the fixed header's high nibble.
const (
	pkConnect   = 1
	pkConnack   = 2
	pkPublish   = 3
	pkPuback    = 4
	pkPubrec    = 5
	pkPubrel    = 6
	pkPubcomp   = 7
	pkSubscribe = 8
	pkSuback    = 9
	pkPingreq   = 12
	pkPingresp  = 13
	pkDisconn   = 14
)

// packetNames name the packet types in errors.
var packetNames = [16]string{"reserved type 0", "CONNECT", "CONNACK", "PUBLISH", "PUBACK", "PUBREC", "PUBREL",
	"PUBCOMP", "SUBSCRIBE", "SUBACK", "UNSUBSCRIBE", "UNSUBACK", "PINGREQ", "PINGRESP", "DISCONNECT", "reserved type 15"}

// maxRemaining is the largest remaining length MQTT can encode (four
// bytes: MQTT 3.1.1, 2.2.3).
const maxRemaining = 268_435_455

// errMalformed is the error of a packet from the upstream that breaks
// MQTT 3.1.1: the connection ends with it.
var errMalformed = errors.New("malformed packet from the upstream")

// malformed is an errMalformed saying what is wrong.
func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errMalformed, fmt.Sprintf(format, args...))
}

// appendHeader appends a fixed header: first byte and remaining length
// (the same base-128 encoding as a uvarint).
func appendHeader(b []byte, first byte, remaining int) []byte {
	return binary.AppendUvarint(append(b, first), uint64(remaining))
}

func appendMQTTString(b []byte, s string) []byte {
	return append(binary.BigEndian.AppendUint16(b, uint16(len(s))), s...)
}

// appendPublish appends a PUBLISH of topic and payload at qos (id is
// its packet ID, for QoS 1), or fails for a message MQTT 3.1.1 cannot
// carry: a topic of over 65,535 bytes or a packet over maxRemaining.
func appendPublish(b []byte, topic string, payload []byte, qos byte, retain bool, id uint16) ([]byte, error) {
	if len(topic) > 0xFFFF {
		return b, fmt.Errorf("topic of %d bytes: MQTT 3.1.1 carries at most 65535", len(topic))
	}
	n := 2 + len(topic) + len(payload)
	if qos > 0 {
		n += 2
	}
	if n > maxRemaining {
		return b, fmt.Errorf("publish of %d bytes: MQTT 3.1.1 carries at most %d", n, maxRemaining)
	}
	first := byte(pkPublish<<4) | qos<<1
	if retain {
		first |= 1
	}
	b = appendMQTTString(appendHeader(b, first, n), topic)
	if qos > 0 {
		b = binary.BigEndian.AppendUint16(b, id)
	}
	return append(b, payload...), nil
}

// appendAck appends a packet of two bytes' body, a packet ID: PUBACK,
// PUBREC, PUBCOMP (PUBREL's flags are 0010: MQTT 3.1.1, 3.6.1).
func appendAck(b []byte, typ byte, id uint16) []byte {
	first := typ << 4
	if typ == pkPubrel {
		first |= 2
	}
	return binary.BigEndian.AppendUint16(append(b, first, 2), id)
}

// appendConnect appends d's CONNECT, keepalive in whole seconds
// (rounded up).
func appendConnect(b []byte, d *MQTT, keepAlive uint16) []byte {
	var flags byte
	n := 10 + 2 + len(d.ClientID)
	if !d.Persistent {
		flags |= 0x02 // clean session
	}
	if d.Username != "" {
		flags |= 0x80
		n += 2 + len(d.Username)
		if d.Password != "" {
			flags |= 0x40
			n += 2 + len(d.Password)
		}
	}
	b = appendMQTTString(appendHeader(b, pkConnect<<4, n), "MQTT")
	b = binary.BigEndian.AppendUint16(append(b, 4, flags), keepAlive) // protocol level 4: 3.1.1
	b = appendMQTTString(b, d.ClientID)
	if flags&0x80 != 0 {
		b = appendMQTTString(b, d.Username)
	}
	if flags&0x40 != 0 {
		b = appendMQTTString(b, d.Password)
	}
	return b
}

// appendSubscribe appends a SUBSCRIBE of filters at QoS 1.
func appendSubscribe(b []byte, id uint16, filters []string) []byte {
	n := 2
	for _, f := range filters {
		n += 2 + len(f) + 1
	}
	b = binary.BigEndian.AppendUint16(appendHeader(b, pkSubscribe<<4|2, n), id)
	for _, f := range filters {
		b = append(appendMQTTString(b, f), 1)
	}
	return b
}

// packet is one packet read: its type, its fixed header's flags and its
// body (the variable header and payload).
type packet struct {
	typ, flags byte
	body       []byte
}

// readPacket reads the next packet from r. A PUBLISH's body is its own
// (handed on to Deliver); any other's is read into *scratch, valid until
// the next call. A connection that ends between two packets returns
// io.EOF; one that ends within a packet an error saying so.
func readPacket(r *bufio.Reader, scratch *[]byte) (packet, error) {
	first, err := r.ReadByte()
	if err != nil {
		return packet{}, err
	}
	p := packet{typ: first >> 4, flags: first & 0x0F}
	n, err := readRemaining(r)
	if err != nil {
		if errors.Is(err, errMalformed) {
			return p, err
		}
		return p, truncated(p.typ, err)
	}
	if p.typ == pkPublish {
		// Read as it comes: the remaining length is the upstream's
		// word, and a stalled or broken upstream claiming 256 MiB must
		// not make the gateway allocate them up front.
		body, err := io.ReadAll(io.LimitReader(r, int64(n)))
		if err == nil && len(body) < n {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return p, truncated(p.typ, fmt.Errorf("%d of %d bytes read: %w", len(body), n, err))
		}
		p.body = body
		return p, nil
	}
	if n > maxControl {
		return p, malformed("%s of %d bytes", packetNames[p.typ], n)
	}
	if n > cap(*scratch) {
		*scratch = make([]byte, n)
	}
	body := (*scratch)[:n]
	if k, err := io.ReadFull(r, body); err != nil {
		return p, truncated(p.typ, fmt.Errorf("%d of %d bytes read: %w", k, n, err))
	}
	p.body = body
	return p, nil
}

// maxControl bounds the body of a packet other than PUBLISH that an
// MQTT 3.1.1 server sends a client: a SUBACK holds a return code per
// filter subscribed (a SUBSCRIBE's filters fit in its own packet), the
// others two bytes or none.
const maxControl = 1 << 16

// truncated is the error of a packet whose bytes stopped coming.
func truncated(typ byte, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("the upstream closed the connection within a %s packet (%v)", packetNames[typ], err)
	}
	return fmt.Errorf("reading a %s packet: %w", packetNames[typ], err)
}

// readRemaining reads a fixed header's remaining length: at most four
// bytes, the last without its high bit.
func readRemaining(r *bufio.Reader) (int, error) {
	n, shift := 0, 0
	for i := 0; i < 4; i++ {
		c, err := r.ReadByte()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
		n |= int(c&0x7F) << shift
		if c&0x80 == 0 {
			return n, nil
		}
		shift += 7
	}
	return 0, malformed("a remaining length of more than four bytes")
}

// idOf returns the packet ID of a packet whose body is one (PUBACK,
// PUBREC, PUBREL, PUBCOMP), checking its size and flags.
func idOf(p packet) (uint16, error) {
	want := byte(0)
	if p.typ == pkPubrel {
		want = 2
	}
	if len(p.body) != 2 || p.flags != want {
		return 0, malformed("%s of %d bytes, flags %04b (want 2 bytes, flags %04b)", packetNames[p.typ], len(p.body), p.flags, want)
	}
	id := binary.BigEndian.Uint16(p.body)
	if id == 0 {
		return 0, malformed("%s for packet ID 0", packetNames[p.typ])
	}
	return id, nil
}

// publishIn is a PUBLISH the upstream sent.
type publishIn struct {
	topic   string
	payload []byte
	qos     byte
	retain  bool
	id      uint16 // QoS 1 and 2
}

// parsePublish reads a PUBLISH's fields from its packet.
func parsePublish(p packet) (publishIn, error) {
	m := publishIn{qos: p.flags >> 1 & 3, retain: p.flags&1 != 0}
	if m.qos == 3 {
		return m, malformed("PUBLISH at QoS 3")
	}
	b := p.body
	if len(b) < 2 || 2+int(binary.BigEndian.Uint16(b)) > len(b) {
		return m, malformed("PUBLISH of %d bytes shorter than its topic", len(b))
	}
	n := 2 + int(binary.BigEndian.Uint16(b))
	m.topic, b = string(b[2:n]), b[n:]
	if m.qos > 0 {
		if len(b) < 2 || binary.BigEndian.Uint16(b) == 0 {
			return m, malformed("PUBLISH at QoS %d without a packet ID", m.qos)
		}
		m.id, b = binary.BigEndian.Uint16(b), b[2:]
	}
	m.payload = b
	return m, nil
}

// connackError is the error of a CONNACK's return code (MQTT 3.1.1,
// 3.2.2.3), nil for 0 (accepted).
func connackError(code byte) error {
	texts := [...]string{1: "unacceptable protocol version", 2: "identifier rejected", 3: "server unavailable",
		4: "bad user name or password", 5: "not authorized"}
	if code == 0 {
		return nil
	}
	if int(code) < len(texts) {
		return fmt.Errorf("%s (CONNACK return code %d)", texts[code], code)
	}
	return fmt.Errorf("refused with CONNACK return code %d", code)
}
