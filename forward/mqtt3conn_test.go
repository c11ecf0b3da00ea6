package forward

import (
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/poll"
)

// sendAll sends n QoS 1 messages on c (payloads "1" to "n", topic
// topic) with at most window in flight, each acknowledged in order, and
// fails the test on any error. first, when not nil, is an Ack sent
// before and left alone (in flight meanwhile).
func sendAll(t *testing.T, c *mqtt3Conn, topic string, n, window int) {
	t.Helper()
	var sent []Ack
	for i := 1; i <= n; i++ {
		if len(sent) == window {
			if err := waitAck(t, sent[0]); err != nil {
				t.Fatalf("message %d: %v", i-window, err)
			}
			sent = sent[1:]
		}
		sent = append(sent, c.Send(&Message{Topic: topic, Payload: []byte(strconv.Itoa(i))}, 1))
	}
	for _, a := range sent {
		if err := waitAck(t, a); err != nil {
			t.Fatal(err)
		}
	}
}

// wrapSends is more messages than there are packet IDs.
const wrapSends = 70_000

// TestMQTT3PacketIDsWrapMosquitto: 70,000 QoS 1 messages with 500 in
// flight to a real Mosquitto take every packet ID and start again at 1:
// each is acknowledged, its own PUBACK matched by ID (Mosquitto
// acknowledges a QoS 1 publish once it has it), and the connection
// stays up. (A subscriber counting them at Mosquitto took over a minute
// under the race detector on the loaded machine.)
func TestMQTT3PacketIDsWrapMosquitto(t *testing.T) {
	up := mosquittotest.Start(t)
	c := dial3(t, &MQTT{Address: up.Addr, ClientID: "gw-wrap"})
	sendAll(t, c, "wrap/t", wrapSends, 500)
	if want := uint16(wrapSends - 0xFFFF); c.next != want {
		t.Fatalf("last packet ID taken %d, want %d (every ID once, then again from 1)", c.next, want)
	}
	select {
	case <-c.Lost():
		t.Fatalf("the connection ended: %v", c.Reason())
	default:
	}
}

// TestMQTT3PacketIDsSkipThoseInFlight: a packet ID is taken again only
// once free. The tiny upstream holds back the PUBACK of the first
// message (ID 1) while 70,000 more go, acknowledged at once: none of
// them reuses ID 1 (a reuse would have the upstream take it for a
// duplicate and the first Ack complete with the later message's
// PUBACK), ID 2 is reused after wrapping, and the first Ack completes
// only when its own PUBACK comes.
func TestMQTT3PacketIDsSkipThoseInFlight(t *testing.T) {
	var reused, seen2, seenMax atomic.Int64
	release := make(chan struct{})
	addr := tinyUpstream(t, func(c *tinyConn) {
		c.handshake(false, 0)
		held := false
		for {
			p, err := c.read()
			if err != nil {
				return
			}
			if p.typ != pkPublish {
				continue
			}
			switch id := p.id(); {
			case !held && id == 1:
				held = true // its PUBACK waits for release
				go func() { <-release; c.puback(1) }()
				continue
			case id == 1:
				reused.Add(1)
			case id == 2:
				seen2.Add(1)
			case id == 0xFFFF:
				seenMax.Add(1)
			}
			c.puback(p.id())
		}
	})
	c := dial3(t, &MQTT{Address: addr, ClientID: "gw"})
	first := c.Send(&Message{Topic: "t", Payload: []byte("first")}, 1)
	sendAll(t, c, "t", wrapSends, 100)
	if reused.Load() != 0 || seen2.Load() != 2 || seenMax.Load() != 1 {
		t.Fatalf("ID 1 reused %d times while in flight (want 0); ID 2 sent %d times (want 2), ID 65535 %d (want 1)",
			reused.Load(), seen2.Load(), seenMax.Load())
	}
	if isDone(first) {
		t.Fatalf("the first message's Ack completed (%v) before its PUBACK", first.Error())
	}
	close(release)
	if err := waitAck(t, first); err != nil {
		t.Fatal(err)
	}
}

// TestMQTT3UnknownPuback: a PUBACK for a packet ID not in flight ends
// the connection, saying so, and the message in flight fails with
// ErrEnded (sent again on the next connection).
func TestMQTT3UnknownPuback(t *testing.T) {
	addr := tinyUpstream(t, func(c *tinyConn) {
		c.handshake(false, 0)
		p := c.expect(pkPublish)
		c.puback(p.id() + 1)
		c.untilEOF()
	})
	c := dial3(t, &MQTT{Address: addr, ClientID: "gw"})
	a := c.Send(&Message{Topic: "t", Payload: []byte("x")}, 1)
	if err := waitAck(t, a); !errors.Is(err, ErrEnded) {
		t.Fatalf("the message in flight: %v, want ErrEnded", err)
	}
	if why := waitLost(t, c); why == nil || !strings.Contains(why.Error(), "packet ID 2, which is not in flight (PUBACK)") {
		t.Fatalf("the connection ended with %v, want the unknown PUBACK named", why)
	}
}

// TestMQTT3MalformedPackets: a packet from the upstream that breaks
// MQTT 3.1.1, or stops half way, ends the connection with an error
// naming it.
func TestMQTT3MalformedPackets(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bytes []byte
		close bool // the upstream closes the connection after them
		want  string
	}{
		{"truncated PUBACK", []byte{0x40, 2, 0}, true, "the upstream closed the connection within a PUBACK packet"},
		{"PUBACK of 3 bytes", []byte{0x40, 3, 0, 1, 0}, false, "malformed packet from the upstream: PUBACK of 3 bytes"},
		{"PUBACK with flags", []byte{0x42, 2, 0, 1}, false, "malformed packet from the upstream: PUBACK of 2 bytes, flags 0010"},
		{"PUBACK for ID 0", []byte{0x40, 2, 0, 0}, false, "PUBACK for packet ID 0"},
		{"remaining length of 5 bytes", []byte{0x40, 0xFF, 0xFF, 0xFF, 0xFF, 1}, false, "a remaining length of more than four bytes"},
		{"truncated remaining length", []byte{0x30, 0xFF}, true, "within a PUBLISH packet"},
		{"PUBLISH at QoS 3", []byte{0x36, 5, 0, 1, 't', 0, 1}, false, "PUBLISH at QoS 3"},
		{"PUBLISH shorter than its topic", []byte{0x30, 3, 0, 9, 't'}, false, "PUBLISH of 3 bytes shorter than its topic"},
		{"PUBLISH without packet ID", []byte{0x32, 4, 0, 1, 't', 0}, false, "PUBLISH at QoS 1 without a packet ID"},
		{"a second CONNACK", []byte{0x20, 2, 0, 0}, false, "unexpected CONNACK packet from the upstream"},
		{"PINGRESP with a body", []byte{0xD0, 1, 0}, false, "PINGRESP of 1 bytes"},
		{"SUBACK not asked for", []byte{0x90, 3, 0, 1, 0}, false, "packet ID 1, which is no SUBSCRIBE in flight (SUBACK)"},
		{"SUBACK claiming 256 MiB", []byte{0x90, 0xFF, 0xFF, 0xFF, 0x7F}, false, "malformed packet from the upstream: SUBACK of 268435455 bytes"},
		{"PUBLISH claiming 256 MiB, cut off", []byte{0x30, 0xFF, 0xFF, 0xFF, 0x7F, 0, 1, 't'}, true, "within a PUBLISH packet (3 of 268435455 bytes read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := tinyUpstream(t, func(c *tinyConn) {
				c.handshake(false, 0)
				c.write(tc.bytes...)
				if !tc.close {
					c.untilEOF()
				}
			})
			c := dial3(t, &MQTT{Address: addr, ClientID: "gw"})
			if why := waitLost(t, c); why == nil || !strings.Contains(why.Error(), tc.want) {
				t.Fatalf("the connection ended with %v, want %q", why, tc.want)
			}
			if a := c.Send(&Message{Topic: "t"}, 1); !errors.Is(waitAck(t, a), ErrEnded) {
				t.Fatalf("a Send after the end: %v, want ErrEnded", a.Error())
			}
		})
	}
}

// TestMQTT3KeepaliveWithoutPingresp: an upstream that takes the
// PINGREQs and never answers ends the connection at the next one.
func TestMQTT3KeepaliveWithoutPingresp(t *testing.T) {
	var pings atomic.Int64
	addr := tinyUpstream(t, func(c *tinyConn) {
		c.handshake(false, 0)
		for _, p := range c.untilEOF() {
			if p.typ == pkPingreq {
				pings.Add(1)
			}
		}
	})
	c := dial3(t, &MQTT{Address: addr, ClientID: "gw", KeepAlive: 50 * time.Millisecond})
	if why := waitLost(t, c); why == nil || !strings.Contains(why.Error(), "no PINGRESP within the keepalive (50ms)") {
		t.Fatalf("the connection ended with %v, want the missing PINGRESP", why)
	}
	poll.Until(t, 10*time.Second, "the PINGREQ at the upstream", func() bool { return pings.Load() >= 1 })
}

// TestMQTT3WriteTimeout: an upstream that stops reading ends the
// connection once a write has waited WriteTimeout for room: the Send
// blocked in it returns, failed.
func TestMQTT3WriteTimeout(t *testing.T) {
	done := make(chan struct{})
	addr := tinyUpstream(t, func(c *tinyConn) {
		c.handshake(false, 0)
		<-done // reads nothing more
	})
	defer close(done)
	c := dial3(t, &MQTT{Address: addr, ClientID: "gw", WriteTimeout: 100 * time.Millisecond})
	payload := make([]byte, 64<<10)
	sent := make(chan error, 1)
	go func() {
		for {
			a := c.Send(&Message{Topic: "t", Payload: payload}, 0)
			if failedNow(a) {
				sent <- a.Error()
				return
			}
		}
	}()
	if why := waitLost(t, c); why == nil || !strings.Contains(why.Error(), "a write waited 100ms for the upstream to read (write timeout)") {
		t.Fatalf("the connection ended with %v, want the write timeout", why)
	}
	select {
	case err := <-sent:
		if !errors.Is(err, ErrEnded) {
			t.Fatalf("the blocked Send: %v, want ErrEnded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the blocked Send did not return within 10s of the end")
	}
}

// TestMQTT3Connect: the CONNECT carries the client ID, the login, clean
// session (not Persistent) and the keepalive in seconds; each CONNACK
// refusal is an error that names it; an upstream that never answers is
// given up after Timeout.
func TestMQTT3Connect(t *testing.T) {
	got := make(chan connect, 1)
	addr := tinyUpstream(t, func(c *tinyConn) {
		got <- c.handshake(false, 0)
		c.untilEOF()
	})
	dial3(t, &MQTT{Address: addr, ClientID: "gw-1", Username: "u", Password: "p", KeepAlive: 1500 * time.Millisecond})
	want := connect{proto: "MQTT", level: 4, flags: 0x80 | 0x40 | 0x02, keepAlive: 2, clientID: "gw-1", username: "u", password: "p"}
	if cn := <-got; cn != want {
		t.Fatalf("CONNECT %+v, want %+v", cn, want)
	}
	addr = tinyUpstream(t, func(c *tinyConn) {
		got <- c.handshake(false, 0)
		c.untilEOF()
	})
	dial3(t, &MQTT{Address: addr, ClientID: "gw-2", Persistent: true})
	want = connect{proto: "MQTT", level: 4, keepAlive: 30, clientID: "gw-2"}
	if cn := <-got; cn != want {
		t.Fatalf("CONNECT %+v, want %+v", cn, want)
	}

	for code, text := range map[byte]string{1: "unacceptable protocol version (CONNACK return code 1)", 2: "identifier rejected (CONNACK return code 2)",
		3: "server unavailable (CONNACK return code 3)", 4: "bad user name or password (CONNACK return code 4)",
		5: "not authorized (CONNACK return code 5)", 9: "refused with CONNACK return code 9"} {
		addr := tinyUpstream(t, func(c *tinyConn) { c.handshake(false, code); c.untilEOF() })
		d := &MQTT{Address: addr, ClientID: "gw"}
		if _, err := d.Dial(t.Context()); err == nil || err.Error() != "connect to mqtt://"+addr+": "+text {
			t.Errorf("CONNACK %d: %v, want %q", code, err, text)
		}
	}
	addr = tinyUpstream(t, func(c *tinyConn) { c.expect(pkConnect); c.untilEOF() })
	d := &MQTT{Address: addr, ClientID: "gw", Timeout: 100 * time.Millisecond}
	if _, err := d.Dial(t.Context()); err == nil || !strings.Contains(err.Error(), "no CONNACK within 100ms") {
		t.Fatalf("an upstream silent after the CONNECT: %v, want no CONNACK", err)
	}
}

// TestMQTT3Commands: commands are delivered in arrival order, those
// that come before the SUBACK too; each is acknowledged (PUBACK, or
// PUBREC and PUBCOMP at QoS 2) only once Deliver returned nil; one
// Deliver could not keep ends the connection, unacknowledged.
func TestMQTT3Commands(t *testing.T) {
	var returned atomic.Int64 // Deliver calls that returned nil
	var delivered []string
	result := make(chan string, 1) // what the upstream saw, "" for as it should
	addr := tinyUpstream(t, func(c *tinyConn) {
		c.handshake(false, 0)
		sub := c.expect(pkSubscribe)
		if sub.flags != 2 || sub.id() != subscribeID || string(sub.body[2:]) != "\x00\x05cmd/#\x01" {
			result <- "SUBSCRIBE " + strconv.Quote(string(sub.body))
			return
		}
		c.write(0x32, 10, 0, 5, 'c', 'm', 'd', '/', 'a', 0, 9, '1') // before the SUBACK
		c.write(0x90, 3, 0, subscribeID, 1)
		c.write(0x34, 10, 0, 5, 'c', 'm', 'd', '/', 'b', 0, 10, '2') // QoS 2
		for _, want := range []struct {
			typ byte
			id  uint16
			n   int64
		}{{pkPuback, 9, 1}, {pkPubrec, 10, 2}} {
			p := c.expect(want.typ)
			if p.id() != want.id || returned.Load() < want.n {
				result <- packetNames[p.typ] + " " + strconv.Itoa(int(p.id())) + " before Deliver returned"
				return
			}
		}
		c.write(appendAck(nil, pkPubrel, 10)...)
		if p := c.expect(pkPubcomp); p.id() != 10 {
			result <- "PUBCOMP for " + strconv.Itoa(int(p.id()))
			return
		}
		c.write(0x32, 12, 0, 7, 'c', 'm', 'd', '/', 'b', 'a', 'd', 0, 11, '3')
		for _, p := range c.untilEOF() {
			if p.typ == pkPuback {
				result <- "PUBACK for a command not kept"
				return
			}
		}
		result <- ""
	})
	c := dial3(t, &MQTT{Address: addr, ClientID: "gw", Subscribe: []string{"cmd/#"}, Map: Map{Local: "dev/", Remote: "cmd/"},
		Deliver: func(topic string, payload []byte, _ bool, qos byte) error {
			delivered = append(delivered, topic+" "+string(payload)+" "+strconv.Itoa(int(qos)))
			if topic == "dev/bad" {
				return errors.New("disk full")
			}
			returned.Add(1)
			return nil
		}})
	if why := waitLost(t, c); why == nil || why.Error() != "command on cmd/bad not kept, not acknowledged: disk full" {
		t.Fatalf("the connection ended with %v, want the command not kept", why)
	}
	c.Close()
	if r := <-result; r != "" {
		t.Fatal(r)
	}
	if want := []string{"dev/a 1 1", "dev/b 2 2", "dev/bad 3 1"}; strings.Join(delivered, ",") != strings.Join(want, ",") {
		t.Fatalf("delivered %q, want %q", delivered, want)
	}
}
