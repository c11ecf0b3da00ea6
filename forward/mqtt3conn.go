package forward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// dial3 connects to d's upstream over MQTT 3.1.1 with the forwarder's
// own client, mqtt3Conn.
//
// It replaces paho.mqtt.golang, whose publish path cost the drain more
// than anything of the forwarder's own (docs/benchmarks.md,
// "Forwarding"): each publish went through two unbuffered channels to a
// writer goroutine, with a timer, a token and a store key made with
// fmt.Sprintf, each PUBACK another key. Here Send encodes the PUBLISH
// and writes it straight into the connection's buffer (batchConn) on
// the forwarder's goroutine; one reader goroutine matches each PUBACK
// to its Send by packet ID.
func (d *MQTT) dial3(ctx context.Context, timeout, keepAlive, writeTimeout time.Duration) (Conn, error) {
	bc, err := d.dial(ctx, timeout)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", d.Addr(), err)
	}
	c := &mqtt3Conn{Ending: NewEnding(), bc: bc, d: d, writeTimeout: writeTimeout,
		inflight: make(map[uint16]*Pending), commands: len(d.Subscribe) > 0 && d.Deliver != nil, wake: make(chan struct{}, 1)}
	kept, err := c.connect(ctx, timeout, keepAlive)
	if err != nil {
		_ = bc.Close()
		return nil, fmt.Errorf("connect to %s: %w", d.Addr(), err)
	}
	if c.commands {
		// The SUBSCRIBE is written before the reader starts, its packet
		// ID taken: a Send never reuses it while its SUBACK is awaited.
		c.sub = NewPending()
		c.inflight[subscribeID] = c.sub
		c.next = subscribeID
		if err := c.write(appendSubscribe(nil, subscribeID, d.Subscribe)); err != nil {
			_ = bc.Close()
			return nil, fmt.Errorf("subscribe upstream to %v: %w", d.Subscribe, err)
		}
		go c.deliverAll()
	}
	go c.read()
	go c.ping(keepAlive)
	if !c.commands {
		return c, nil
	}
	subscribed := func() error {
		if err := c.sub.Error(); err != nil {
			return fmt.Errorf("subscribe upstream to %v: %w", d.Subscribe, err)
		}
		return nil
	}
	if kept {
		// Commands queued for the kept session come before the SUBACK,
		// however long they take (subscribeKept); they are delivered
		// as they come, whatever the SUBACK.
		subscribeKept(c.Ending, func() error { <-c.sub.Done(); return subscribed() })
		return c, nil
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-c.sub.Done():
		err = subscribed()
	case <-t.C:
		err = fmt.Errorf("subscribe upstream to %v: no SUBACK within %s", d.Subscribe, timeout)
	case <-ctx.Done():
		err = fmt.Errorf("subscribe upstream to %v: %w", d.Subscribe, ctx.Err())
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// subscribeID is the SUBSCRIBE's packet ID: the connection's first.
const subscribeID = 1

// maxInflight3 is the most QoS 1 publishes in flight: every packet ID
// (1 to 65535) but the SUBSCRIBE's.
const maxInflight3 = 65534

// mqtt3Conn is a connection to an MQTT 3.1.1 upstream. Send is called
// from one goroutine at a time (the pump's); the rest is safe for
// concurrent use. Its goroutines: read (every packet from the
// upstream), ping (the keepalive) and, with commands, deliverAll.
type mqtt3Conn struct {
	*Ending
	bc           *batchConn
	d            *MQTT
	writeTimeout time.Duration
	buf          []byte // Send's encoding of a PUBLISH

	// mu guards inflight (the QoS 1 publishes and the SUBSCRIBE sent
	// and not yet acknowledged, by packet ID), next (the last packet ID
	// taken) and ended (inflight completed: nothing more goes in).
	mu       sync.Mutex
	inflight map[uint16]*Pending
	next     uint16
	ended    bool
	sub      *Pending // the SUBSCRIBE's, with commands; set before read starts

	pingOut atomic.Bool // a PINGREQ is awaiting its PINGRESP

	commands bool // incoming publishes go to d.Deliver
	cmdMu    sync.Mutex
	cmds     []publishIn   // received, not yet delivered
	wake     chan struct{} // cmds has something
	scratch  []byte        // read's buffer for packets other than PUBLISH
}

// written is the Ack of a QoS 0 publish: complete once written.
var written = Failed(nil)

// Static packets.
var (
	pingreq    = []byte{pkPingreq << 4, 0}
	disconnect = []byte{pkDisconn << 4, 0}
)

// connect writes the CONNECT and reads the CONNACK within timeout (or
// until ctx ends), returning the CONNACK's session present flag.
func (c *mqtt3Conn) connect(ctx context.Context, timeout, keepAlive time.Duration) (kept bool, err error) {
	nc := c.bc.Conn
	_ = nc.SetReadDeadline(time.Now().Add(timeout))
	stop := context.AfterFunc(ctx, func() { _ = nc.SetReadDeadline(time.Now()) })
	secs := min((keepAlive+time.Second-1)/time.Second, 0xFFFF)
	if _, err := c.bc.Write(appendConnect(nil, c.d, uint16(secs))); err != nil {
		stop()
		return false, err
	}
	p, err := readPacket(c.bc.r, &c.scratch)
	if !stop() && ctx.Err() != nil {
		return false, ctx.Err()
	}
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF):
		return false, errors.New("the upstream closed the connection before its CONNACK")
	case errors.As(err, &ne) && ne.Timeout():
		return false, fmt.Errorf("no CONNACK within %s", timeout)
	case err != nil:
		return false, err // what failed: "remote error: tls: certificate required"
	case p.typ != pkConnack:
		return false, fmt.Errorf("%s from the upstream before its CONNACK", packetNames[p.typ])
	case len(p.body) != 2 || p.flags != 0 || p.body[0] > 1:
		return false, malformed("CONNACK % x, flags %04b", p.body, p.flags)
	}
	if err := connackError(p.body[1]); err != nil {
		return false, err
	}
	_ = nc.SetReadDeadline(time.Time{})
	return p.body[0] == 1, nil
}

// MaxInflight is the most QoS 1 publishes the connection can have in
// flight: one per free packet ID. The pump keeps within it, so that Send
// always finds one.
func (c *mqtt3Conn) MaxInflight() int { return maxInflight3 }

// Hold and Release make mqtt3Conn a holder: the publishes of a batch
// leave in one write.
func (c *mqtt3Conn) Hold()    { c.bc.Hold() }
func (c *mqtt3Conn) Release() { c.bc.Release() }

// Send writes m as a PUBLISH at qos (0, or 1 for any other: the
// forwarder's MaxQoS). At QoS 0 its Ack is complete once written; at
// QoS 1 once its PUBACK came.
func (c *mqtt3Conn) Send(m *Message, qos byte) Ack {
	var a *Pending
	var id uint16
	if qos > 0 {
		qos = 1
		var err error
		if a, id, err = c.take(); err != nil {
			return Failed(err)
		}
	}
	b, err := appendPublish(c.buf[:0], m.Topic, m.Payload, qos, m.Retain, id)
	if err != nil {
		c.free(id)
		return Failed(Refuse("too_large", err))
	}
	if cap(b) <= maxKeptBuf {
		c.buf = b
	}
	if err := c.write(b); err != nil {
		c.fail(err)
		if a != nil {
			return a // failed by fail, as every other in flight
		}
		return Failed(ended(c.Reason()))
	}
	if a != nil {
		return a
	}
	return written
}

// maxKeptBuf bounds the encoding buffer Send keeps for the next: one
// large message does not hold its size for the connection's life.
const maxKeptBuf = 64 << 10

// take returns a new Ack in flight under a free packet ID: the one
// after the last taken (1 after 65535) that is not in flight.
func (c *mqtt3Conn) take() (*Pending, uint16, error) {
	a := NewPending()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return nil, 0, ended(c.Reason())
	}
	for range 0xFFFF {
		if c.next++; c.next == 0 {
			c.next = 1
		}
		if _, busy := c.inflight[c.next]; !busy {
			c.inflight[c.next] = a
			return a, c.next, nil
		}
	}
	return nil, 0, errors.New("no free packet ID: 65535 messages in flight")
}

// free gives back packet ID id (0: none), taken for a publish never
// written.
func (c *mqtt3Conn) free(id uint16) {
	if id == 0 {
		return
	}
	c.mu.Lock()
	delete(c.inflight, id)
	c.mu.Unlock()
}

// ended is ErrEnded with the connection's reason.
func ended(reason error) error {
	if reason == nil {
		return ErrEnded
	}
	return fmt.Errorf("%w (%v)", ErrEnded, reason)
}

// write writes packet p. It waits for room in the connection's buffer
// at most writeTimeout: beyond it the upstream stopped reading, and the
// connection ends. Only a write that must wait arms a timer.
func (c *mqtt3Conn) write(p []byte) error {
	if ok, err := c.bc.TryWrite(p); ok {
		return err
	}
	t := time.AfterFunc(c.writeTimeout, func() {
		c.fail(fmt.Errorf("a write waited %s for the upstream to read (write timeout)", c.writeTimeout))
	})
	defer t.Stop()
	_, err := c.bc.Write(p)
	return err
}

// fail ends the connection with why: every Ack in flight fails with
// ErrEnded, and the socket closes.
func (c *mqtt3Conn) fail(why error) {
	c.EndWith(why)
	c.failInflight()
	_ = c.bc.Close()
}

// failInflight completes every Ack in flight with ErrEnded, once the
// connection ended; none is added after.
func (c *mqtt3Conn) failInflight() {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return
	}
	c.ended = true
	all := c.inflight
	c.inflight = nil
	c.mu.Unlock()
	err := ended(c.Reason())
	for _, a := range all {
		a.Finish(err)
	}
}

// Close sends a DISCONNECT (unless the upstream stopped reading) and
// closes the connection.
func (c *mqtt3Conn) Close() {
	_, _ = c.bc.TryWrite(disconnect)
	c.End()
	c.failInflight()
	_ = c.bc.Close()
}

// read reads the upstream's packets until the connection ends, which a
// packet MQTT 3.1.1 does not allow here ends too.
func (c *mqtt3Conn) read() {
	for {
		p, err := readPacket(c.bc.r, &c.scratch)
		if err == nil {
			err = c.handle(p)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the upstream closed the connection")
			}
			c.fail(err)
			return
		}
	}
}

// handle acts on packet p from the upstream.
func (c *mqtt3Conn) handle(p packet) error {
	var out [4]byte
	switch p.typ {
	case pkPuback:
		id, err := idOf(p)
		if err != nil {
			return err
		}
		c.mu.Lock()
		a, ok := c.inflight[id]
		if ok && a != c.sub {
			delete(c.inflight, id)
		}
		c.mu.Unlock()
		if !ok || a == c.sub {
			return fmt.Errorf("the upstream acknowledged packet ID %d, which is not in flight (PUBACK)", id)
		}
		a.Finish(nil)
	case pkPublish:
		m, err := parsePublish(p)
		if err != nil {
			return err
		}
		if c.commands {
			c.cmdMu.Lock()
			c.cmds = append(c.cmds, m)
			c.cmdMu.Unlock()
			select {
			case c.wake <- struct{}{}:
			default:
			}
			return nil
		}
		// Nobody takes commands on this connection: acknowledged and
		// dropped, as paho.mqtt.golang did.
		return c.ackIn(m)
	case pkPubrel:
		id, err := idOf(p)
		if err != nil {
			return err
		}
		return c.write(appendAck(out[:0], pkPubcomp, id))
	case pkSuback:
		return c.subacked(p)
	case pkPingresp:
		if len(p.body) != 0 || p.flags != 0 {
			return malformed("PINGRESP of %d bytes, flags %04b", len(p.body), p.flags)
		}
		c.pingOut.Store(false)
	default:
		return fmt.Errorf("unexpected %s packet from the upstream", packetNames[p.typ])
	}
	return nil
}

// ackIn acknowledges an incoming publish m: PUBACK at QoS 1, PUBREC at
// QoS 2 (the PUBREL that follows is answered in handle).
func (c *mqtt3Conn) ackIn(m publishIn) error {
	var out [4]byte
	switch m.qos {
	case 1:
		return c.write(appendAck(out[:0], pkPuback, m.id))
	case 2:
		return c.write(appendAck(out[:0], pkPubrec, m.id))
	}
	return nil
}

// subacked completes the SUBSCRIBE with its SUBACK p. A filter the
// upstream refused (return code 0x80) does not end the connection, as
// with paho.mqtt.golang before: messages go upstream all the same, and
// no commands come for that filter.
func (c *mqtt3Conn) subacked(p packet) error {
	if len(p.body) < 3 || p.flags != 0 {
		return malformed("SUBACK of %d bytes, flags %04b", len(p.body), p.flags)
	}
	id := uint16(p.body[0])<<8 | uint16(p.body[1])
	c.mu.Lock()
	a, ok := c.inflight[id]
	if ok && a == c.sub {
		delete(c.inflight, id)
	}
	c.mu.Unlock()
	if !ok || a != c.sub {
		return fmt.Errorf("the upstream acknowledged packet ID %d, which is no SUBSCRIBE in flight (SUBACK)", id)
	}
	codes := p.body[2:]
	if len(codes) != len(c.d.Subscribe) {
		return malformed("SUBACK with %d return codes for %d filters", len(codes), len(c.d.Subscribe))
	}
	var refused []string
	for i, code := range codes {
		if code > 2 && code != 0x80 {
			return malformed("SUBACK return code 0x%02X", code)
		}
		if code == 0x80 {
			refused = append(refused, c.d.Subscribe[i])
		}
	}
	if len(refused) > 0 {
		// As over MQTT 5 (mqtt5.go): a connection without the commands
		// it was made for is no connection; the error says which.
		a.Finish(fmt.Errorf("refused (SUBACK return code 0x80) for %s", strings.Join(refused, ", ")))
		return nil
	}
	a.Finish(nil)
	return nil
}

// deliverAll hands the commands received to Deliver, in arrival order,
// each acknowledged once Deliver returned nil; one it could not keep
// ends the connection unacknowledged (MQTT.deliver), and nothing after
// it is delivered.
func (c *mqtt3Conn) deliverAll() {
	var batch []publishIn
	for {
		select {
		case <-c.Lost():
			return
		case <-c.wake:
		}
		c.cmdMu.Lock()
		batch, c.cmds = c.cmds, batch[:0]
		c.cmdMu.Unlock()
		for _, m := range batch {
			if isClosed(c.Lost()) {
				return
			}
			if !c.d.deliver(m.topic, m.payload, m.retain, m.qos, c.Ending) {
				c.fail(c.Reason())
				return
			}
			if err := c.ackIn(m); err != nil {
				c.fail(err)
				return
			}
		}
		clear(batch) // the payloads
	}
}

// ping keeps the connection alive: a PINGREQ every keepalive; one still
// unanswered at the next ends the connection.
func (c *mqtt3Conn) ping(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.Lost():
			return
		case <-t.C:
		}
		if c.pingOut.Swap(true) {
			c.fail(fmt.Errorf("no PINGRESP within the keepalive (%s)", every))
			return
		}
		if err := c.write(pingreq); err != nil {
			c.fail(err)
			return
		}
	}
}
