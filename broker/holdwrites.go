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
// PINGRESP) joins the held bytes in the order it came, or, while a
// release writes them, waits for it, as it would for mochi's lock on a
// write of the acker's own. A Close or CloseWrite writes what is held
// first. With a spool (a backend consumer, consumers.go) nothing is
// held: the spool writes what is pending in one call already.

// maxHeld bounds the bytes held: a write that takes them beyond it
// releases them.
const maxHeld = 16 << 10

// heldBufs are the held bytes' buffers, taken by hold and given back by
// a release: a connection not holding keeps none.
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

// flush writes what is held, in one call, and ends the holding.
func (c *protoConn) flush() error { return c.release(true) }

// release writes what is held, in one call, and ends the holding; with
// nothing held it does nothing. When another release is writing, wait
// says whether to wait for it or to return at once. A write error
// closes the socket: the bytes mochi took for written are lost, and a
// connection whose write failed ends, as when mochi's own write fails.
func (c *protoConn) release(wait bool) error {
	if !c.holding.Load() {
		return nil
	}
	if wait {
		c.wmu.Lock()
	} else if !c.wmu.TryLock() {
		return nil
	}
	defer c.wmu.Unlock()
	c.heldMu.Lock()
	if !c.holding.Load() {
		c.heldMu.Unlock()
		return nil
	}
	buf := c.held
	c.releasing = true // writes meanwhile wait for wmu
	c.heldMu.Unlock()
	var err error
	if len(*buf) > 0 {
		_, err = c.Conn.Write(*buf)
	}
	c.heldMu.Lock()
	c.held, c.releasing = nil, false
	// Cleared once written: a write that finds it clear goes after
	// these bytes.
	c.holding.Store(false)
	c.heldMu.Unlock()
	if cap(*buf) <= maxHeld {
		*buf = (*buf)[:0]
		heldBufs.Put(buf)
	}
	if err != nil {
		_ = c.Conn.Close()
	}
	return err
}

// writeHeld takes b while holding (holding was seen set).
func (c *protoConn) writeHeld(b []byte) (int, error) {
	c.heldMu.Lock()
	if c.holding.Load() && !c.releasing {
		*c.held = append(*c.held, b...)
		full := len(*c.held) >= maxHeld
		c.heldMu.Unlock()
		if full {
			if err := c.release(true); err != nil {
				return 0, err
			}
		}
		return len(b), nil
	}
	c.heldMu.Unlock()
	c.wmu.Lock() // after the release writing, if one is
	defer c.wmu.Unlock()
	return c.Conn.Write(b)
}
