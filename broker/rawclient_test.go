package broker

import (
	"bufio"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// rawClient is an MQTT client written by hand, packet by packet, so a
// test chooses every byte it sends (packet IDs included) and sees every
// byte the server sends.
type rawClient struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	c := dialTCP(t, addr)
	t.Cleanup(func() { _ = c.Close() })
	return &rawClient{t: t, c: c, r: bufio.NewReader(c)}
}

// rawConnect3 is an MQTT 3.1.1 CONNECT, clean session, keepalive 60 s,
// with a user name and password when user is not "".
func rawConnect3(id, user, password string) []byte {
	flags := byte(0x02)
	if user != "" {
		flags |= flagUsername | flagPassword
	}
	body := append(append(mqttString("MQTT"), 4, flags, 0, 60), mqttString(id)...)
	if user != "" {
		body = append(append(body, mqttString(user)...), mqttString(password)...)
	}
	return packet(0x10, body)
}

// rawPublishQ is an MQTT 3.1.1 PUBLISH at qos (1 or 2) with packet ID pid.
func rawPublishQ(topic string, qos byte, pid int, payload string) []byte {
	return packet(0x30|qos<<1, append(append(mqttString(topic), u16(pid)...), payload...))
}

var rawPingreq = []byte{0xc0, 0}

func (r *rawClient) send(data ...[]byte) {
	r.t.Helper()
	for _, d := range data {
		if _, err := r.c.Write(d); err != nil {
			r.t.Fatalf("write: %v", err)
		}
	}
}

// next reads the server's next packet; io.EOF when it closed the
// connection at a packet boundary.
func (r *rawClient) next() (rawPacket, error) {
	_ = r.c.SetReadDeadline(time.Now().Add(waitTimeout))
	typ, err := r.r.ReadByte()
	if err != nil {
		return rawPacket{}, err
	}
	n, mul := 0, 1
	for i := 0; i < 4; i++ {
		b, err := r.r.ReadByte()
		if err != nil {
			return rawPacket{}, err
		}
		n += int(b&0x7f) * mul
		mul *= 128
		if b&0x80 == 0 {
			break
		}
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r.r, body); err != nil {
		return rawPacket{}, err
	}
	return rawPacket{typ: typ, body: body}, nil
}

// must reads the next packet and fails the test unless it is of type
// typ (the fixed header's high nibble).
func (r *rawClient) must(typ byte, what string) rawPacket {
	r.t.Helper()
	p, err := r.next()
	if err != nil {
		r.t.Fatalf("%s: %v", what, err)
	}
	if p.typ>>4 != typ {
		r.t.Fatalf("%s: packet type %d (% x), want %d", what, p.typ>>4, p.body, typ)
	}
	return p
}

// until reads packets until one of type typ and returns those before
// it.
func (r *rawClient) until(typ byte, what string) []rawPacket {
	r.t.Helper()
	var got []rawPacket
	for {
		p, err := r.next()
		if err != nil {
			r.t.Fatalf("%s: %v after %d packets", what, err, len(got))
		}
		if p.typ>>4 == typ {
			return got
		}
		got = append(got, p)
	}
}

// connack reads the CONNACK and fails the test unless it accepts.
func (r *rawClient) connack() {
	r.t.Helper()
	if p := r.must(2, "CONNACK"); p.body[1] != 0 {
		r.t.Fatalf("CONNACK return code %d", p.body[1])
	}
}

// closedSilently fails the test unless the server closes the connection
// without sending another byte.
func (r *rawClient) closedSilently(what string) {
	r.t.Helper()
	_ = r.c.SetReadDeadline(time.Now().Add(waitTimeout))
	got, err := io.ReadAll(r.r)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		r.t.Fatalf("%s: connection still open after %s (read % x)", what, waitTimeout, got)
	}
	if len(got) > 0 {
		r.t.Fatalf("%s: the server sent % x before it closed the connection, want nothing (MQTT 3.1.1 has no server DISCONNECT)", what, got)
	}
}

// publishID returns the packet ID of a PUBLISH at QoS 1 or 2 and its
// topic.
func publishID(p rawPacket) (uint16, string) {
	n := int(p.body[0])<<8 | int(p.body[1])
	return uint16(p.body[2+n])<<8 | uint16(p.body[3+n]), string(p.body[2 : 2+n])
}
