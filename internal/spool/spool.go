// Package spool writes to a connection from a goroutine of its own:
// Write copies into the spool and returns, and the spool's writer sends
// everything pending in one writev. It serves the gateway's backend
// consumers (broker/consumers.go) and its upstream connections
// (forward/batchconn.go).
package spool

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Writer is a connection's write spool: Write copies and returns, and
// blocks only while limit bytes are pending; the writer goroutine sends
// what is pending, batch after batch, in one writev each.
//
// The bytes are kept in chunks of chunkSize bytes, taken from a pool
// and given back once written: a backlog of megabytes is never copied to
// grow a buffer (which, with mochi's writer preempted in the copy, left a
// backend consumer's queue full for tens of milliseconds), and a drained spool
// holds nothing. A write larger than limit is taken once nothing else is
// pending.
type Writer struct {
	conn  net.Conn // the socket
	limit int

	mu      sync.Mutex
	ready   *sync.Cond // bytes pending, or closing
	space   *sync.Cond // pending shrank, or the spool failed
	pending [][]byte   // chunks of what Write took, not yet taken by the writer
	spare   [][]byte   // the writer's previous list, for reuse
	// queued counts the bytes pending and being written, readable
	// without mu.
	queued  atomic.Int64
	err     error // the first write error
	closing bool
	done    chan struct{} // closed when the writer has ended and closed conn
	wrote   func()
	ended   func()
}

// chunkSize is the size of a spool's chunks.
const chunkSize = 32 << 10

var chunks = sync.Pool{New: func() any { b := make([]byte, 0, chunkSize); return &b }}

// Drain bounds how long Close spends writing what is pending (a
// DISCONNECT is among it) before it closes the socket.
const Drain = time.Second

// New starts the spool's writer on conn. wrote, when not nil,
// runs after each Write; ended once the writer has closed conn.
func New(conn net.Conn, limit int, wrote, ended func()) *Writer {
	s := &Writer{conn: conn, limit: limit, done: make(chan struct{}), wrote: wrote, ended: ended}
	s.ready = sync.NewCond(&s.mu)
	s.space = sync.NewCond(&s.mu)
	go s.run()
	return s
}

// Write copies b into the spool; it blocks while limit bytes are
// pending, and fails once the socket failed or the spool is closed.
func (s *Writer) Write(b []byte) (int, error) {
	n, err := s.write(b)
	if n > 0 && s.wrote != nil {
		s.wrote()
	}
	return n, err
}

func (s *Writer) write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.err == nil && !s.closing && s.queued.Load() > 0 && int(s.queued.Load())+len(b) > s.limit {
		s.space.Wait()
	}
	switch {
	case s.err != nil:
		return 0, s.err
	case s.closing:
		return 0, net.ErrClosed
	}
	n := len(b)
	for len(b) > 0 {
		last := len(s.pending) - 1
		if last < 0 || len(s.pending[last]) == cap(s.pending[last]) {
			s.pending = append(s.pending, (*chunks.Get().(*[]byte))[:0])
			last++
		}
		c := s.pending[last]
		k := copy(c[len(c):cap(c)], b)
		s.pending[last] = c[:len(c)+k]
		b = b[k:]
	}
	s.queued.Add(int64(n))
	s.ready.Signal()
	return n, nil
}

// Pending returns the bytes written to the spool and not yet to the
// socket.
func (s *Writer) Pending() int { return int(s.queued.Load()) }

// Limit returns the bytes the spool takes before Write blocks.
func (s *Writer) Limit() int { return s.limit }

// run writes what is pending until the spool is closed and drained, or
// a write fails; then it closes the socket.
func (s *Writer) run() {
	defer func() {
		_ = s.conn.Close()
		close(s.done)
		if s.ended != nil {
			s.ended()
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		for len(s.pending) == 0 && !s.closing {
			s.ready.Wait()
		}
		if len(s.pending) == 0 { // closing, and all written
			return
		}
		out := s.pending
		s.pending, s.spare = s.spare[:0], nil
		s.mu.Unlock()
		bufs := make(net.Buffers, len(out)) // WriteTo consumes its slice
		copy(bufs, out)
		var total int64
		for _, c := range out {
			total += int64(len(c))
		}
		_, err := bufs.WriteTo(s.conn)
		for i, c := range out {
			c = c[:0]
			chunks.Put(&c)
			out[i] = nil
		}
		s.mu.Lock()
		s.spare = out[:0]
		s.queued.Add(-total)
		if err != nil {
			s.err = err
			for _, c := range s.pending {
				s.queued.Add(-int64(len(c)))
			}
			s.pending = nil
			s.space.Broadcast()
			return
		}
		s.space.Broadcast()
	}
}

// Close ends reads at once (the connection's reader returns) and lets
// the writer write what is pending (a DISCONNECT may be the last of it)
// for at most Drain before it closes the socket. It does not wait: mochi
// may close a client while it holds locks (a session taken over). Wait
// waits.
func (s *Writer) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return net.ErrClosed
	}
	s.closing = true
	now := time.Now()
	_ = s.conn.SetReadDeadline(now)
	_ = s.conn.SetWriteDeadline(now.Add(Drain))
	s.ready.Signal()
	s.space.Broadcast()
	return nil
}

// Wait returns once the writer has ended and closed the socket.
func (s *Writer) Wait() { <-s.done }
