package forward

import (
	"bufio"
	"net"
	"sync"
	"time"
)

// batchConn is a connection that reads through a buffer and coalesces
// writes: paho.mqtt.golang reads a packet a byte or a field at a time
// and writes each packet with a syscall of its own, which makes the
// syscalls, not the network, the bound of a forwarder's throughput
// (BenchmarkDrain's profile). Write copies into a pending buffer and
// returns; one goroutine writes whatever has accumulated while it wrote
// the previous batch. Under light load each packet goes at once, as
// before; under load many go in one syscall. A write error is returned
// by the next Write and closes the connection, so the client sees it as
// lost; what was pending is then not sent, which costs nothing here:
// a message leaves the forward log only once acknowledged.
type batchConn struct {
	net.Conn
	r *bufio.Reader

	mu      sync.Mutex
	cond    *sync.Cond
	pending []byte
	writing bool // the flusher holds a batch it is writing
	err     error
	closed  bool
}

// maxPendingWrite bounds the bytes Write accepts ahead of the flusher;
// beyond it Write waits.
const maxPendingWrite = 1 << 20

func newBatchConn(c net.Conn) *batchConn {
	b := &batchConn{Conn: c, r: bufio.NewReaderSize(c, 32<<10)}
	b.cond = sync.NewCond(&b.mu)
	go b.flush()
	return b
}

func (b *batchConn) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.pending) >= maxPendingWrite && b.err == nil && !b.closed {
		b.cond.Wait()
	}
	if b.err != nil {
		return 0, b.err
	}
	if b.closed {
		return 0, net.ErrClosed
	}
	b.pending = append(b.pending, p...)
	b.cond.Broadcast()
	return len(p), nil
}

// flush writes what is pending, batch after batch, until the connection
// is closed or a write fails.
func (b *batchConn) flush() {
	var out []byte
	for {
		b.mu.Lock()
		for len(b.pending) == 0 && !b.closed {
			b.cond.Wait()
		}
		if len(b.pending) == 0 {
			b.mu.Unlock()
			return
		}
		out, b.pending = b.pending, out[:0]
		b.writing = true
		b.cond.Broadcast()
		b.mu.Unlock()
		_, err := b.Conn.Write(out)
		b.mu.Lock()
		b.writing = false
		if err != nil && b.err == nil {
			b.err = err
		}
		b.cond.Broadcast()
		b.mu.Unlock()
		if err != nil {
			b.Conn.Close()
			return
		}
	}
}

// Close sends what is pending (a DISCONNECT, say), waiting at most a
// second, then closes the connection.
func (b *batchConn) Close() error {
	_ = b.Conn.SetWriteDeadline(time.Now().Add(time.Second))
	b.mu.Lock()
	for (len(b.pending) > 0 || b.writing) && b.err == nil {
		b.cond.Wait()
	}
	b.closed = true
	b.cond.Broadcast()
	b.mu.Unlock()
	return b.Conn.Close()
}
