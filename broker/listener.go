package broker

import (
	"errors"
	"net"
	"time"

	"github.com/mochi-mqtt/server/v2/listeners"
)

// tcpListener is a mochi listeners.Listener over a plain TCP socket. It
// replaces mochi's listeners.TCP, which reports its address only as a
// string, stops accepting for good on the first Accept error (EMFILE in a
// reconnect storm would silently end the gateway's MQTT service), and
// leaves connections that have not finished CONNECT running after Close.
//
// Init binds the address; Serve accepts until Close; Close stops
// accepting, lets mochi disconnect the established clients, closes every
// connection still open and waits for their goroutines.
type tcpListener struct {
	listenerBase
	done chan struct{} // closed by Close
}

var _ listeners.Listener = (*tcpListener)(nil)

// defaultConnectTimeout is how long a new connection may take to send
// CONNECT.
const defaultConnectTimeout = 10 * time.Second

func newTCPListener(id, address string) *tcpListener {
	return &tcpListener{listenerBase: newListenerBase(id, address), done: make(chan struct{})}
}

// Protocol returns "tcp", or "tls" for a TLS listener.
func (l *tcpListener) Protocol() string {
	if l.tlsConfig != nil {
		return "tls"
	}
	return "tcp"
}

// Serve accepts connections until Close and hands each to establish on
// its own goroutine. Accept errors other than a closed listener (EMFILE
// in a reconnect storm) are logged and retried with a growing delay, 5ms
// to 1s, like net/http's.
func (l *tcpListener) Serve(establish listeners.EstablishFn) {
	l.mu.Lock()
	ln := l.ln
	if l.closed || ln == nil {
		l.mu.Unlock()
		return
	}
	l.wg.Add(1)
	l.mu.Unlock()
	defer l.wg.Done()

	var delay time.Duration
	for {
		conn, err := ln.Accept()
		if err != nil {
			if l.isClosed() || errors.Is(err, net.ErrClosed) {
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			l.log.Warn("accept failed; retrying", "error", err, "retry_in", delay)
			t := time.NewTimer(delay)
			select {
			case <-l.done:
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		delay = 0
		if !l.track(conn) {
			_ = conn.Close()
			if l.isClosed() {
				return
			}
			continue
		}
		go func() {
			var err error
			defer func() { l.untrack(conn, err) }()
			_ = conn.SetReadDeadline(time.Now().Add(l.connectTimeout))
			if err = l.serve(establish, conn); err != nil {
				// Every ended session lands here (EOF, keepalive timeout,
				// a refused CONNECT): per-connection detail, not news.
				l.log.Debug("connection ended", "remote", conn.RemoteAddr().String(), "error", err)
			}
		}()
	}
}

// Close stops accepting, disconnects this listener's clients (MQTT 5
// clients get DISCONNECT 0x8B), closes whatever is still open
// (connections still in CONNECT) and waits for all their goroutines.
// Calls after the first only wait.
func (l *tcpListener) Close(listeners.CloseFn) {
	if l.markClosed() {
		close(l.done)
		l.mu.Lock()
		ln := l.ln
		l.mu.Unlock()
		if ln != nil {
			_ = ln.Close()
		}
		l.endConns()
	}
	l.wg.Wait()
}
