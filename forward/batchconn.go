package forward

import (
	"bufio"
	"net"
	"time"

	"github.com/devicegate/devicegate/internal/spool"
)

// batchConn is a connection that reads through a buffer and coalesces
// writes: paho.mqtt.golang reads a packet a byte or a field at a time
// and writes each packet with a syscall of its own, which makes the
// syscalls, not the network, the bound of a forwarder's throughput
// (BenchmarkDrain's profile). Writes go through a spool
// (internal/spool): Write copies and returns, and the spool's writer
// sends whatever has accumulated while it wrote the previous batch.
// Under light load each packet goes at once; under load many go in one
// syscall. A write error is returned by the next Write and closes the
// connection, so the client sees it as lost; what was pending is then
// not sent, which costs nothing here: a message leaves the forward log
// only once acknowledged.
type batchConn struct {
	net.Conn
	r *bufio.Reader
	w *spool.Writer
}

// maxPendingWrite bounds the bytes Write accepts ahead of the spool's
// writer; beyond it Write waits.
const maxPendingWrite = 1 << 20

func newBatchConn(c net.Conn) *batchConn {
	return &batchConn{Conn: c, r: bufio.NewReaderSize(c, 32<<10), w: spool.New(c, maxPendingWrite, nil, nil)}
}

func (b *batchConn) Read(p []byte) (int, error)  { return b.r.Read(p) }
func (b *batchConn) Write(p []byte) (int, error) { return b.w.Write(p) }

// SetWriteDeadline does nothing: a Write only copies into the spool, and
// the socket's write deadline is the spool's (Close sets it, to end a
// write to an upstream that stopped reading within spool.Drain).
// paho.mqtt.golang sets a deadline around each packet and clears it
// after; passed on, the clearing could undo Close's.
func (b *batchConn) SetWriteDeadline(time.Time) error { return nil }

// SetDeadline sets the read deadline only (see SetWriteDeadline).
func (b *batchConn) SetDeadline(t time.Time) error { return b.Conn.SetReadDeadline(t) }

// Close sends what is pending (a DISCONNECT, say), for at most
// spool.Drain, then closes the connection.
func (b *batchConn) Close() error {
	err := b.w.Close()
	b.w.Wait()
	return err
}
