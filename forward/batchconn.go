package forward

import (
	"bufio"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/devicegate/devicegate/internal/spool"
)

// batchConn is a connection that reads through a buffer and coalesces
// writes: an MQTT client reading a packet a byte or a field at a time
// (paho.golang; mqtt3Conn reads from r) and writing each packet with a
// syscall of its own makes the syscalls, not the network, the bound of
// a forwarder's throughput (BenchmarkDrain's profile). Writes go
// through a spool (internal/spool): Write copies and returns, and the
// spool's writer sends whatever has accumulated while it wrote the
// previous batch. Under light load each packet goes at once; under load
// many go in one syscall. A write error is returned by the next Write and closes the
// connection, so the client sees it as lost; what was pending is then
// not sent, which costs nothing here: a message leaves the forward log
// only once acknowledged.
//
// Hold and Release (the holder interface) keep the packets written in
// between back and hand them to the spool together: the pump holds
// while it sends a batch of messages, so that the batch leaves in one
// syscall rather than one or two packets each (the spool's writer,
// idle, takes each packet as it comes).
type batchConn struct {
	net.Conn
	r *bufio.Reader
	w *spool.Writer
	// hold is set between Hold and Release; mu orders the writes to
	// the spool and guards held, what Write kept back meanwhile.
	hold atomic.Bool
	mu   sync.Mutex
	held []byte
}

// maxPendingWrite bounds the bytes Write accepts ahead of the spool's
// writer; beyond it Write waits.
const maxPendingWrite = 1 << 20

// maxHeld bounds the bytes kept back between Hold and Release; beyond
// it writes go on to the spool.
const maxHeld = 256 << 10

func newBatchConn(c net.Conn) *batchConn {
	return &batchConn{Conn: c, r: bufio.NewReaderSize(c, 32<<10), w: spool.New(c, maxPendingWrite, nil, nil)}
}

func (b *batchConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// Write copies p into the spool, or keeps it back while held. What
// was kept back goes first, so the bytes keep their order.
func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.hold.Load() && len(b.held)+len(p) <= maxHeld {
		b.held = append(b.held, p...)
		return len(p), nil
	}
	if err := b.releaseLocked(); err != nil {
		return 0, err
	}
	return b.w.Write(p)
}

// TryWrite is Write when it need not wait, reporting whether it wrote:
// false, with nothing written, when the spool has no room for p yet or
// a Release's goroutine is handing on what was held. mqtt3Conn bounds
// only the writes that must wait (its write timeout).
func (b *batchConn) TryWrite(p []byte) (bool, error) {
	if !b.mu.TryLock() {
		return false, nil
	}
	defer b.mu.Unlock()
	if b.hold.Load() && len(b.held)+len(p) <= maxHeld {
		b.held = append(b.held, p...)
		return true, nil
	}
	// Under mu only the spool's writer changes Pending, and only down:
	// what fits now fits when written (the spool's own test).
	if n := b.w.Pending() + len(b.held); n > 0 && n+len(p) > b.w.Limit() {
		return false, nil
	}
	if err := b.releaseLocked(); err != nil {
		return true, err
	}
	_, err := b.w.Write(p)
	return true, err
}

// releaseLocked hands what was kept back to the spool (b.mu held).
func (b *batchConn) releaseLocked() error {
	if len(b.held) == 0 {
		return nil
	}
	_, err := b.w.Write(b.held)
	b.held = b.held[:0]
	return err
}

// Hold keeps the packets written from now on back until Release.
func (b *batchConn) Hold() { b.hold.Store(true) }

// Release hands what was kept back to the spool. It never waits (the
// pump calls it): when a write is under way or the spool is too full to
// take it at once, a goroutine of its own hands it on, and any Write
// that comes before hands it on first.
func (b *batchConn) Release() {
	b.hold.Store(false)
	if b.mu.TryLock() {
		if len(b.held) == 0 || b.w.Pending()+len(b.held) <= b.w.Limit() {
			_ = b.releaseLocked() // a failure shows in the next Write, and the spool closes the socket
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
	}
	go func() {
		b.mu.Lock()
		_ = b.releaseLocked()
		b.mu.Unlock()
	}()
}

// SetWriteDeadline does nothing: a Write only copies into the spool, and
// the socket's write deadline is the spool's (Close sets it, to end a
// write to an upstream that stopped reading within spool.Drain). A
// client that sets a deadline around each packet and clears it after
// (paho.mqtt.golang did) would otherwise undo Close's.
func (b *batchConn) SetWriteDeadline(time.Time) error { return nil }

// SetDeadline sets the read deadline only (see SetWriteDeadline).
func (b *batchConn) SetDeadline(t time.Time) error { return b.Conn.SetReadDeadline(t) }

// Close sends what is pending (a DISCONNECT, say), for at most
// spool.Drain, then closes the connection. What is still held is
// dropped: a connection ends with its messages unacknowledged, and
// they are sent again on the next.
func (b *batchConn) Close() error {
	err := b.w.Close()
	b.w.Wait()
	return err
}
