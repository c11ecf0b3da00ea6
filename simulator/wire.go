package simulator

import (
	"net"
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

type countedConn struct {
	net.Conn
	w *wireCount
}

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
