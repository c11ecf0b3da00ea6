package forward

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// tinyUpstream is a real MQTT 3.1.1 server on 127.0.0.1:0 that speaks
// the few packets a test needs, for what Mosquitto never does: a PUBACK
// for a packet ID not in flight, a malformed packet, no PINGRESP, a
// PUBACK held back. Each connection runs script on a goroutine of its
// own; the test's cleanup closes the listener and every connection and
// waits for the scripts.
func tinyUpstream(t *testing.T, script func(c *tinyConn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
			wg.Go(func() {
				defer nc.Close()
				script(&tinyConn{Conn: nc, r: bufio.NewReader(nc), t: t})
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// tinyConn is one connection to a tinyUpstream.
type tinyConn struct {
	net.Conn
	r *bufio.Reader
	t *testing.T
}

// tinyPacket is a packet a tinyConn read: type, flags, body.
type tinyPacket struct {
	typ, flags byte
	body       []byte
}

// id is the packet ID that starts p's body (PUBACK, SUBSCRIBE), or a
// QoS 1 PUBLISH's, after its topic.
func (p tinyPacket) id() uint16 {
	b := p.body
	if p.typ == pkPublish {
		b = b[2+int(binary.BigEndian.Uint16(b)):]
	}
	return binary.BigEndian.Uint16(b)
}

// read reads one packet, framed on its own (not with the client's
// codec): io.EOF once the client closed the connection.
func (c *tinyConn) read() (tinyPacket, error) {
	first, err := c.r.ReadByte()
	if err != nil {
		return tinyPacket{}, err
	}
	n, err := binary.ReadUvarint(c.r) // the remaining length's encoding
	if err != nil {
		return tinyPacket{}, err
	}
	p := tinyPacket{typ: first >> 4, flags: first & 0x0F, body: make([]byte, n)}
	_, err = io.ReadFull(c.r, p.body)
	return p, err
}

// expect reads a packet of type typ, failing the test on anything else.
func (c *tinyConn) expect(typ byte) tinyPacket {
	p, err := c.read()
	if err != nil || p.typ != typ {
		c.t.Errorf("tiny upstream: read %s (%v), want %s", packetNames[p.typ], err, packetNames[typ])
		return tinyPacket{}
	}
	return p
}

// connect is a CONNECT's fields, as the tiny upstream read them.
type connect struct {
	proto              string
	level, flags       byte
	keepAlive          uint16
	clientID, username string
	password           string
}

// handshake reads the CONNECT and answers CONNACK code, with the
// session present flag when kept.
func (c *tinyConn) handshake(kept bool, code byte) connect {
	p := c.expect(pkConnect)
	b := p.body
	str := func() string {
		if len(b) < 2 {
			return ""
		}
		n := int(binary.BigEndian.Uint16(b))
		s := string(b[2 : 2+n])
		b = b[2+n:]
		return s
	}
	var cn connect
	if len(b) < 10 {
		c.t.Errorf("tiny upstream: CONNECT of %d bytes", len(b))
		return cn
	}
	cn.proto = str()
	cn.level, cn.flags, cn.keepAlive = b[0], b[1], binary.BigEndian.Uint16(b[2:])
	b = b[4:]
	cn.clientID = str()
	if cn.flags&0x80 != 0 {
		cn.username = str()
	}
	if cn.flags&0x40 != 0 {
		cn.password = str()
	}
	present := byte(0)
	if kept {
		present = 1
	}
	c.write(pkConnack<<4, 2, present, code)
	return cn
}

// write writes raw bytes.
func (c *tinyConn) write(b ...byte) {
	if _, err := c.Write(b); err != nil {
		c.t.Errorf("tiny upstream: write: %v", err)
	}
}

// puback acknowledges packet ID id.
func (c *tinyConn) puback(id uint16) { c.write(appendAck(nil, pkPuback, id)...) }

// untilEOF reads what the client sends until it closes the connection,
// returning the packets.
func (c *tinyConn) untilEOF() []tinyPacket {
	var got []tinyPacket
	for {
		p, err := c.read()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				c.t.Logf("tiny upstream: read: %v", err)
			}
			return got
		}
		got = append(got, p)
	}
}

// dial3 dials d, failing the test on an error; the test's cleanup
// closes the connection.
func dial3(t *testing.T, d *MQTT) *mqtt3Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := d.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.(*mqtt3Conn)
}

// waitAck waits for a, at most 10 s, and returns its error.
func waitAck(t *testing.T, a Ack) error {
	t.Helper()
	waitClosed(t, a.Done(), "an acknowledgement")
	return a.Error()
}

// waitLost waits for c to end, at most 10 s, and returns its reason.
func waitLost(t *testing.T, c Conn) error {
	t.Helper()
	waitClosed(t, c.Lost(), "the connection's end")
	return c.Reason()
}

// waitClosed waits for done, failing the test after 10 s.
func waitClosed(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10s", what)
	}
}
