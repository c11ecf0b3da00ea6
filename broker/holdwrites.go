package broker

import "sync"

// A client's forwarded QoS 1 publishes are acknowledged by its acker
// (forwardack.go), and one group commit makes a whole window of them
// durable at once. mochi writes each packet with a call of its own when
// nothing is queued for the client, which is the case for these
// PUBACKs: one system call each (a third of the gateway's CPU when
// forwarding into Redis Streams, docs/benchmarks.md). So the acker
// holds the connection's writes around a run of PUBACKs whose messages
// are durable, and flushes them in one write before it waits for
// anything. Whatever else is written meanwhile (mochi's writer, a
// PINGRESP) joins the held bytes in the order it came; a Close or
// CloseWrite writes them first. With a spool (a backend consumer,
// consumers.go) nothing is held: the spool writes what is pending in
// one call already.

// maxHeld bounds the bytes held: beyond it they are written at once
// and holding goes on.
const maxHeld = 16 << 10

// heldBufs are the held bytes' buffers, taken by hold and given back by
// flush: a connection not holding keeps none.
var heldBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// hold makes the connection's writes wait until flush, which writes
// them in one call. It reports false, and holds nothing, with a spool.
// The caller flushes before anything that may wait.
func (c *protoConn) hold() bool {
	if c.spool.Load() != nil {
		return false
	}
	c.heldMu.Lock()
	defer c.heldMu.Unlock()
	if !c.holding.Load() {
		c.held = heldBufs.Get().(*[]byte)
		c.holding.Store(true)
	}
	return true
}

// flush writes what is held, in one call, and ends the holding. A write
// error closes the socket: the bytes mochi took for written are lost,
// and a connection whose write failed ends, as when mochi's own write
// fails. Nothing held: nothing done.
func (c *protoConn) flush() error {
	if !c.holding.Load() {
		return nil
	}
	c.heldMu.Lock()
	defer c.heldMu.Unlock()
	if !c.holding.Load() {
		return nil
	}
	err := c.writeHeldOut()
	// Cleared once written: a Write that finds it clear writes after
	// these bytes, one that found it set waits for heldMu.
	c.holding.Store(false)
	if cap(*c.held) <= maxHeld {
		heldBufs.Put(c.held)
	}
	c.held = nil
	return err
}

// writeHeld takes b while holding (holding was seen set).
func (c *protoConn) writeHeld(b []byte) (int, error) {
	c.heldMu.Lock()
	defer c.heldMu.Unlock()
	if !c.holding.Load() {
		return c.Conn.Write(b) // flushed meanwhile: after what flush wrote
	}
	*c.held = append(*c.held, b...)
	if len(*c.held) >= maxHeld {
		if err := c.writeHeldOut(); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

// writeHeldOut writes the held bytes; a failure closes the socket (see
// flush). Called with heldMu held.
func (c *protoConn) writeHeldOut() error {
	b := *c.held
	*c.held = b[:0]
	if len(b) == 0 {
		return nil
	}
	if _, err := c.Conn.Write(b); err != nil {
		_ = c.Conn.Close()
		return err
	}
	return nil
}
