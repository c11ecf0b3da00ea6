package broker

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// readPacket reads one packet from a raw connection.
func readPacket(t *testing.T, r io.Reader) rawPacket {
	t.Helper()
	var h [1]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		t.Fatalf("read: %v", err)
	}
	n, mul := 0, 1
	for {
		var b [1]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			t.Fatalf("read: %v", err)
		}
		n += int(b[0]&0x7f) * mul
		mul *= 128
		if b[0]&0x80 == 0 {
			break
		}
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		t.Fatalf("read: %v", err)
	}
	return rawPacket{typ: h[0], body: body}
}

// TestSendQuotaRestored: a subscriber that announces a Receive Maximum
// gets at most that many QoS 1 messages unacknowledged; mochi queues the
// rest, and sends one on each packet the subscriber sends while it has
// quota, but it drops a message so sent from its in-flight list, so the
// subscriber's PUBACK for it did not give the quota back. After the
// first backlog the subscriber's quota was gone for good and every later
// message waited for ever (then was dropped as a slow subscriber's).
// The gateway gives the quota back for such a PUBACK.
func TestSendQuotaRestored(t *testing.T) {
	f := start(t, fixtureOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	const receiveMax, n = 2, 10

	sub := dialTCP(t, f.addr)
	defer sub.Close()
	_ = sub.SetDeadline(time.Now().Add(waitTimeout))
	if _, err := sub.Write(rawConnectV(5, "backend-rm", props(prop(propReceiveMaximum, u16(receiveMax)...)), nil)); err != nil {
		t.Fatal(err)
	}
	if p := readPacket(t, sub); p.typ>>4 != 2 || reasonOf(p) != 0 {
		t.Fatalf("CONNACK: % x", p.body)
	}
	if _, err := sub.Write(rawSubscribe(5, 1, "devices/#")); err != nil {
		t.Fatal(err)
	}
	if p := readPacket(t, sub); p.typ>>4 != 9 || reasonOf(p) != 1 {
		t.Fatalf("SUBACK: % x", p.body)
	}

	pub := f.dial5(t, "meter-1", "", nil)
	// Two backlogs: each is acknowledged one message at a time, and
	// every message must come.
	for round := range 2 {
		for i := range n {
			if _, err := pub.Publish(ctx, &paho.Publish{Topic: "devices/meter-1", QoS: 1, Payload: []byte(fmt.Sprint(i))}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range n {
			p := readPacket(t, sub)
			if p.typ>>4 != 3 {
				t.Fatalf("round %d, message %d: packet type %d, want PUBLISH", round, i, p.typ>>4)
			}
			// topic, packet ID
			tl := int(p.body[0])<<8 | int(p.body[1])
			id := p.body[2+tl : 4+tl]
			if _, err := sub.Write([]byte{0x40, 2, id[0], id[1]}); err != nil {
				t.Fatal(err)
			}
		}
	}
}
