package simulator

import (
	"net"
	"sync"
	"sync/atomic"
)

// wireCount counts the bytes a part of the fleet wrote to and read from
// its connections: what the devices' radios would carry (MQTT, and TLS
// when on; not TCP/IP headers). Safe for concurrent use; a nil
// *wireCount counts nothing.
type wireCount struct {
	out, in atomic.Int64
}

// wrap returns conn counting into w.
func (w *wireCount) wrap(conn net.Conn) net.Conn {
	if w == nil {
		return conn
	}
	return &countedConn{Conn: conn, w: w}
}

// countedConn is a net.Conn that counts what goes through it. It is a
// sync.Locker: paho.golang writes a packet as several buffers
// (net.Buffers.WriteTo), in one writev on a *net.TCPConn but in one
// Write each on any other conn, and holds the conn's lock around them
// when it has one; without it a publish and an acknowledgement written
// from two goroutines interleave into a malformed packet.
type countedConn struct {
	net.Conn
	w  *wireCount
	mu sync.Mutex
}

// Lock and Unlock make a packet's writes one (see countedConn).
func (c *countedConn) Lock()   { c.mu.Lock() }
func (c *countedConn) Unlock() { c.mu.Unlock() }

func (c *countedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.w.in.Add(int64(n))
	return n, err
}

func (c *countedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.w.out.Add(int64(n))
	return n, err
}
