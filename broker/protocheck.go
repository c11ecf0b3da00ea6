package broker

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/devicegate/devicegate/internal/spool"
)

// protoConn is a client connection whose inbound bytes are checked, as
// mochi reads them, for what the MQTT specification forbids and mochi
// v2.7.9 accepts, where only the bytes tell (the decoded packet keeps
// the last of a repeated property, and a Receive Maximum or Maximum
// Packet Size of 0 reads as none):
//
//   - a CONNECT whose will topic has a wildcard (MQTT 3.1.1 and 5,
//     [MQTT-3.1.3-11], [MQTT-4.7.0-1]);
//   - in MQTT 5, a CONNECT with Receive Maximum 0 or Maximum Packet
//     Size 0 (3.1.2.11.3, 3.1.2.11.4);
//   - in MQTT 5, a property that may appear once appearing twice, in
//     any packet a client sends (2.2.2.2; only User Property may repeat,
//     and Subscription Identifier in SUBSCRIBE, where mochi refuses more
//     than one itself).
//
// A refused CONNECT gets CONNACK 0x82 (MQTT 5) or none (3.1.1: the
// connection is closed, [MQTT-3.1.4-1]); a later packet gets DISCONNECT
// 0x82. Either way the offending packet never reaches mochi: the bytes
// before it are delivered, then Read fails and mochi ends the client
// (publishing its will, as for any protocol error). The checker only
// reads the bytes mochi reads, in place; it copies nothing, and stops
// following an MQTT 3.1.1 connection after CONNECT.
type protoConn struct {
	net.Conn
	p protoParser
	// failed is the violation found, returned by every Read from the
	// one after the bytes preceding the offending packet.
	failed error
	once   sync.Once
	// refused counts and logs a violation: at CONNECT or after.
	refused func(remote string, atConnect bool, reason string)
	// spool, once set (a backend consumer: consumers.go), takes the
	// writes and the Close.
	spool atomic.Pointer[spool.Writer]
	// delivering is the consumers' gate a publish of this client passed
	// and has not left (consumers.go); touched only on the client's
	// reading goroutine.
	delivering *consumerSet
	// first, while hasFirst, is the connection's first byte, read
	// before mochi got the connection (listener_base.go's serve).
	first    byte
	hasFirst bool
	// reg is the connection's entry in the broker's registry
	// (registry.go), nil until it has one and after it is removed.
	reg atomic.Pointer[regEntry]
	// holding: the writes wait in held until a release
	// (holdwrites.go); read without heldMu, set and cleared under it
	// with held and releasing. wmu is held by a release while it
	// writes, and by a write that waits for it.
	holding   atomic.Bool
	heldMu    sync.Mutex
	held      *[]byte
	releasing bool
	wmu       sync.Mutex
}

// closeFlushTimeout bounds Close's write of the held bytes
// (holdwrites.go): a healthy socket takes them at once.
const closeFlushTimeout = time.Second

// leave ends the delivery of this client's publish, if one passed the
// consumers' gate.
func (c *protoConn) leave() {
	if cs := c.delivering; cs != nil {
		c.delivering = nil
		cs.done()
	}
}

// protocolViolation is a packet the specification forbids.
type protocolViolation struct {
	reason    string
	atConnect bool
}

func (v *protocolViolation) Error() string { return "protocol error: " + v.reason }

// errProtocol matches every protocolViolation with errors.Is.
var errProtocol = errors.New("protocol error")

func (v *protocolViolation) Is(target error) bool { return target == errProtocol }

func (c *protoConn) Read(b []byte) (int, error) {
	if c.failed != nil {
		c.refuse()
		return 0, c.failed
	}
	var n int
	var err error
	if c.hasFirst && len(b) > 0 {
		b[0], c.hasFirst, n = c.first, false, 1
	} else {
		n, err = c.Conn.Read(b)
	}
	if n > 0 && !c.p.off {
		if at, v := c.p.feed(b[:n]); v != nil {
			c.failed = v
			if at > 0 {
				return at, nil // the packets before the offending one
			}
			c.refuse()
			return 0, v
		}
	}
	return n, err
}

// Write writes to the spool once there is one, else to the socket, or,
// while the writes are held, to the held bytes.
func (c *protoConn) Write(b []byte) (int, error) {
	if s := c.spool.Load(); s != nil {
		return s.Write(b)
	}
	if c.holding.Load() {
		return c.writeHeld(b)
	}
	return c.Conn.Write(b)
}

// Close closes the spool (which writes what is pending, then closes the
// socket) once there is one, else writes what is held and closes the
// socket.
func (c *protoConn) Close() error {
	if s := c.spool.Load(); s != nil {
		return s.Close()
	}
	// What mochi wrote before it closed goes first, unless a release
	// is writing: the close must not wait behind a write to a socket
	// the client no longer reads (a session taken over), and ends it.
	// Nor behind its own write of the held bytes to such a socket:
	// that write gets closeFlushTimeout at most.
	if c.holding.Load() {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
		if err := c.release(false); err != nil {
			return nil // its failed write closed the socket
		}
	}
	return c.Conn.Close()
}

// startSpool gives the connection a write spool of limit bytes and
// returns it. It is called while nothing writes to the connection (in
// OnConnect, before the CONNACK).
func (c *protoConn) startSpool(limit int, wrote, ended func()) *spool.Writer {
	s := spool.New(c.Conn, limit, wrote, ended)
	c.spool.Store(s)
	return s
}

// ended leaves the consumers' gate and waits, after mochi is done with
// the connection, for its spool to write what is pending (spool.Drain at
// most) and close the socket.
func (c *protoConn) ended() {
	c.leave()
	if s := c.spool.Load(); s != nil {
		_ = s.Close()
		s.Wait()
	}
}

// CloseWrite half-closes the connection when the one under it can
// (refuse.go's hangUp), after what is held. With a spool it cannot: a
// FIN would overtake the bytes pending; Close then writes them first.
func (c *protoConn) CloseWrite() error {
	if c.spool.Load() != nil {
		return errors.ErrUnsupported
	}
	if err := c.release(true); err != nil {
		return err
	}
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// refuse answers the violation, once: CONNACK or DISCONNECT 0x82 with a
// reason string for an MQTT 5 client, nothing for MQTT 3.1.1.
func (c *protoConn) refuse() {
	c.once.Do(func() {
		v := c.failed.(*protocolViolation)
		if c.refused != nil {
			c.refused(c.RemoteAddr().String(), v.atConnect, v.reason)
		}
		if c.p.version == 5 {
			// The connection ends whatever this write does.
			_, _ = c.Write(refusalPacket(v.atConnect, 0x82, v.reason, c.p.clientMax))
		}
	})
}

// refusalPacket is an MQTT 5 CONNACK (atConnect) or DISCONNECT with
// reason code code and the reason string, left out when the packet would
// exceed the client's Maximum Packet Size (max, 0: none;
// [MQTT-3.1.2-25]).
func refusalPacket(atConnect bool, code byte, reason string, max uint32) []byte {
	if len(reason) > 100 {
		reason = reason[:100] // one byte of remaining length
	}
	var b []byte
	if atConnect {
		b = []byte{0x20, 0, 0x00, code} // CONNACK, no session present
	} else {
		b = []byte{0xe0, 0, code} // DISCONNECT
	}
	withString := 4 + len(reason) // properties length, 0x1F, string length
	if max > 0 && uint32(len(b)+withString) > max {
		b = append(b, 0)
	} else {
		b = append(b, byte(3+len(reason)), 0x1f, 0, byte(len(reason)))
		b = append(b, reason...)
	}
	b[1] = byte(len(b) - 2)
	return b
}

// Packet types (MQTT 5, 2.1.2).
const (
	pktConnect     = 1
	pktPublish     = 3
	pktPuback      = 4
	pktPubcomp     = 7
	pktSubscribe   = 8
	pktUnsubscribe = 10
	pktDisconnect  = 14
	pktAuth        = 15
)

// Parser states, each named for what it does with the field just read
// (or the bytes just skipped); what the checks do not need is skipped.
const (
	stType = iota
	stLength
	stNameLen       // CONNECT: protocol name length
	stLevel         // CONNECT: protocol level
	stFlags         // CONNECT: connect flags
	stConnFlags     // CONNECT: after the connect flags
	stClientID      // CONNECT: before the client ID
	stWill          // CONNECT: after the client ID
	stWillTopicLen  // CONNECT: will topic length
	stWillTopicDone // CONNECT: after the will topic
	stTopicLen      // PUBLISH: topic length
	stPacketID      // PUBLISH: after the topic
	stPropsBegin    // a property section starts
	stPropsLen      // a property section's length
	stPropsNext     // the next property, or the section's end
	stPropID        // a property's identifier
	stPropValue     // a property's 1, 2 or 4 byte or varint value
	stPropSkipLen   // a string's or binary's length: skip it
	stPropPairLen   // a string pair's first length
	stPropPairNext  // a string pair's second length
	stRest          // skip to the end of the packet
)

// Property sections checked.
const (
	secConnect = iota
	secWill
	secOther
)

// protoParser follows the packets of one connection across reads. It
// reads each byte at most once and never looks back, so it keeps only
// the field being read.
type protoParser struct {
	version   byte   // protocol level from CONNECT; 0 before
	clientMax uint32 // the client's Maximum Packet Size; 0 none
	off       bool   // not following: MQTT 3.1.1, or lost (mochi ends it)

	state       int  // what to do when the field is read
	next        int  // the state after the skip
	typ, flags  byte // the current packet's fixed header
	connFlags   byte
	rem         int    // body bytes left in the current packet
	acc, mul    uint32 // the field being read, big-endian or varint
	want        int    // field bytes still to read
	varint      bool
	skip        int  // bytes to pass over before next
	wildcard    bool // the skipped bytes are a will topic: look for + and #
	sawWildcard bool
	sec         int    // the property section's packet part
	afterProps  int    // the state after the property section
	props       int    // bytes left in the property section; <0 outside
	seen        uint64 // property identifiers met in the section
	propID      byte
}

// feed inspects the next bytes of the stream. On a violation it returns
// it with the offset in b where the offending packet starts (0 when it
// started in an earlier read).
func (p *protoParser) feed(b []byte) (int, *protocolViolation) {
	start := 0
	for i := 0; i < len(b) && !p.off; {
		if p.skip > 0 {
			n := min(p.skip, len(b)-i)
			if p.wildcard {
				for _, c := range b[i : i+n] {
					p.sawWildcard = p.sawWildcard || c == '+' || c == '#'
				}
			}
			p.consume(n)
			p.skip -= n
			i += n
			if p.skip > 0 {
				return 0, nil
			}
			if v := p.enter(p.next); v != nil {
				return start, v
			}
			continue
		}
		if p.state == stType {
			start = i
		}
		if w := p.want; w > 1 && !p.varint && len(b)-i >= w && p.state != stLength {
			// A whole fixed-width field is here: read it at once.
			for _, c := range b[i : i+w] {
				p.acc = p.acc<<8 | uint32(c)
			}
			p.consume(w)
			i += w
			p.want = 0
			if v := p.enter(p.state); v != nil {
				return start, v
			}
			continue
		}
		c := b[i]
		i++
		if p.state != stType && p.state != stLength {
			p.consume(1)
		}
		if v := p.byteIn(c); v != nil {
			return start, v
		}
	}
	return 0, nil
}

// consume counts n body bytes read.
func (p *protoParser) consume(n int) {
	p.rem -= n
	if p.props >= 0 {
		p.props -= n
	}
}

// fits reports whether n more bytes lie within the packet and the
// property section; a field that does not is malformed, which mochi
// reports itself.
func (p *protoParser) fits(n int) bool { return n <= p.rem && (p.props < 0 || n <= p.props) }

// field reads a want-byte value (a varint when want is 0), then enters
// state.
func (p *protoParser) field(want int, state int) *protocolViolation {
	if !p.fits(max(want, 1)) {
		return p.enter(stRest)
	}
	p.acc, p.mul, p.want, p.varint, p.state = 0, 1, want, want == 0, state
	return nil
}

// skipThen passes over n bytes, then enters state.
func (p *protoParser) skipThen(n int, state int) *protocolViolation {
	if !p.fits(n) {
		return p.enter(stRest)
	}
	if n == 0 {
		return p.enter(state)
	}
	p.skip, p.next = n, state
	return nil
}

// byteIn takes one byte of the fixed header or of a field.
func (p *protoParser) byteIn(c byte) *protocolViolation {
	switch p.state {
	case stType:
		p.typ, p.flags = c>>4, c&0x0f
		p.acc, p.mul, p.state = 0, 1, stLength
		return nil
	case stLength:
		p.acc += uint32(c&0x7f) * p.mul
		if c&0x80 != 0 {
			if p.mul *= 128; p.mul > 128*128*128 {
				p.off = true // malformed length: mochi ends the connection
			}
			return nil
		}
		p.rem = int(p.acc)
		return p.body()
	}
	if p.varint {
		p.acc += uint32(c&0x7f) * p.mul
		if c&0x80 != 0 {
			if p.mul *= 128; p.mul > 128*128*128 {
				return p.enter(stRest)
			}
			return nil
		}
	} else {
		p.acc = p.acc<<8 | uint32(c)
		if p.want--; p.want > 0 {
			return nil
		}
	}
	return p.enter(p.state)
}

// body starts a packet's body after its fixed header.
func (p *protoParser) body() *protocolViolation {
	p.props, p.skip, p.sec = -1, 0, secOther
	if p.version == 0 {
		if p.typ != pktConnect {
			p.off = true // mochi refuses anything but CONNECT first
			return nil
		}
		return p.field(2, stNameLen)
	}
	switch {
	case p.typ == pktPublish:
		return p.field(2, stTopicLen)
	case p.typ >= pktPuback && p.typ <= pktPubcomp && p.rem > 3:
		return p.skipThen(3, stPropsBegin) // packet ID, reason code
	case p.typ == pktSubscribe || p.typ == pktUnsubscribe:
		return p.skipThen(2, stPropsBegin) // packet ID
	case (p.typ == pktDisconnect || p.typ == pktAuth) && p.rem > 1:
		return p.skipThen(1, stPropsBegin) // reason code
	}
	return p.enter(stRest)
}

// enter acts on the field just read, or the bytes just skipped, in
// state s.
func (p *protoParser) enter(s int) *protocolViolation {
	switch s {
	case stNameLen:
		return p.skipThen(int(p.acc), stLevel)
	case stLevel:
		return p.field(1, stFlags)
	case stFlags:
		p.version = byte(p.acc)
		return p.field(1, stConnFlags)
	case stConnFlags:
		p.connFlags = byte(p.acc)
		if p.version == 5 { // the keepalive, then the properties
			p.sec, p.afterProps = secConnect, stClientID
			return p.skipThen(2, stPropsBegin)
		}
		return p.skipThen(2, stClientID)
	case stClientID:
		return p.field(2, stWill)
	case stWill:
		next := stRest
		if p.connFlags&0x04 != 0 {
			next = stWillTopicLen
			if p.version == 5 {
				p.sec, p.afterProps, next = secWill, stWillTopicLen, stPropsBegin
			}
		}
		return p.skipThen(int(p.acc), next)
	case stWillTopicLen:
		return p.field(2, stWillTopicDone)
	case stWillTopicDone:
		if !p.wildcard { // the length was just read
			p.wildcard, p.sawWildcard = true, false
			return p.skipThen(int(p.acc), stWillTopicDone)
		}
		p.wildcard = false
		if p.sawWildcard {
			return p.violation("will topic contains a wildcard")
		}
		return p.enter(stRest)
	case stTopicLen:
		return p.skipThen(int(p.acc), stPacketID)
	case stPacketID:
		p.afterProps = stRest
		if p.flags&0x06 != 0 { // QoS 1 or 2
			return p.skipThen(2, stPropsBegin)
		}
		return p.enter(stPropsBegin)
	case stPropsBegin:
		if p.sec == secOther {
			p.afterProps = stRest
		}
		return p.field(0, stPropsLen)
	case stPropsLen:
		p.props, p.seen = int(p.acc), 0
		if !p.fits(p.props) {
			return p.enter(stRest)
		}
		return p.enter(stPropsNext)
	case stPropsNext:
		if p.props == 0 {
			p.props = -1
			return p.enter(p.afterProps)
		}
		return p.field(1, stPropID)
	case stPropID:
		return p.property(byte(p.acc))
	case stPropValue:
		return p.propertyValue()
	case stPropSkipLen:
		return p.skipThen(int(p.acc), stPropsNext)
	case stPropPairLen:
		return p.skipThen(int(p.acc), stPropPairNext)
	case stPropPairNext:
		return p.field(2, stPropSkipLen)
	case stRest:
		p.props = -1
		if p.version != 5 {
			p.off = true // MQTT 3.1.1 has nothing more to check
			return nil
		}
		p.state = stType
		return p.skipThen(p.rem, stType)
	case stType:
		p.state = stType
	}
	return nil
}

// Properties with rules of their own.
const (
	propIDUser           = 0x26 // may repeat
	propIDSubscriptionID = 0x0b // may repeat in PUBLISH (server to client)
	propIDReceiveMaximum = 0x21
	propIDMaxPacketSize  = 0x27
)

// Property value kinds, by identifier (MQTT 5, 2.2.2.2): 1, 2 or 4
// bytes, or one of these; 0: unknown.
const (
	kindVarint = -1
	kindBytes  = -2 // a string or binary data
	kindPair   = -3 // a string pair
)

var propKinds = [0x2b]int8{
	0x01: 1, 0x02: 4, 0x03: kindBytes, 0x08: kindBytes, 0x09: kindBytes, 0x0b: kindVarint, 0x11: 4,
	0x12: kindBytes, 0x13: 2, 0x15: kindBytes, 0x16: kindBytes, 0x17: 1, 0x18: 4, 0x19: 1,
	0x1a: kindBytes, 0x1c: kindBytes, 0x1f: kindBytes, 0x21: 2, 0x22: 2, 0x23: 2, 0x24: 1, 0x25: 1,
	0x26: kindPair, 0x27: 4, 0x28: 1, 0x29: 1, 0x2a: 1,
}

// propNames names the properties that may not repeat, for reason
// strings.
var propNames = [0x2b]string{
	0x01: "Payload Format Indicator", 0x02: "Message Expiry Interval", 0x03: "Content Type",
	0x08: "Response Topic", 0x09: "Correlation Data", 0x11: "Session Expiry Interval",
	0x12: "Assigned Client Identifier", 0x13: "Server Keep Alive", 0x15: "Authentication Method",
	0x16: "Authentication Data", 0x17: "Request Problem Information", 0x18: "Will Delay Interval",
	0x19: "Request Response Information", 0x1a: "Response Information", 0x1c: "Server Reference",
	0x1f: "Reason String", 0x21: "Receive Maximum", 0x22: "Topic Alias Maximum", 0x23: "Topic Alias",
	0x24: "Maximum QoS", 0x25: "Retain Available", 0x27: "Maximum Packet Size",
	0x28: "Wildcard Subscription Available", 0x29: "Subscription Identifier Available",
	0x2a: "Shared Subscription Available",
}

// property starts on the property with identifier id.
func (p *protoParser) property(id byte) *protocolViolation {
	if int(id) >= len(propKinds) || propKinds[id] == 0 {
		return p.enter(stRest) // unknown: mochi refuses it
	}
	if id != propIDUser && id != propIDSubscriptionID {
		if p.seen&(1<<id) != 0 {
			return p.violation("duplicate property " + propNames[id])
		}
		p.seen |= 1 << id
	}
	p.propID = id
	switch k := propKinds[id]; k {
	case kindVarint:
		return p.field(0, stPropValue)
	case kindBytes:
		return p.field(2, stPropSkipLen)
	case kindPair:
		return p.field(2, stPropPairLen)
	default:
		return p.field(int(k), stPropValue)
	}
}

// propertyValue checks the value just read of property p.propID.
func (p *protoParser) propertyValue() *protocolViolation {
	if p.sec == secConnect {
		switch p.propID {
		case propIDReceiveMaximum:
			if p.acc == 0 {
				return p.violation("Receive Maximum is 0")
			}
		case propIDMaxPacketSize:
			if p.acc == 0 {
				return p.violation("Maximum Packet Size is 0")
			}
			p.clientMax = p.acc
		}
	}
	return p.enter(stPropsNext)
}

// violation stops the parser on a packet the specification forbids.
func (p *protoParser) violation(reason string) *protocolViolation {
	p.off = true
	return &protocolViolation{reason: reason, atConnect: p.typ == pktConnect}
}
