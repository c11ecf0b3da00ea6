package broker

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
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
	id      string
	address string
	log     *slog.Logger
	// connectTimeout bounds the wait for a new connection's CONNECT.
	// mochi reads CONNECT without any deadline, so a socket that never
	// sends one would hold a goroutine forever; once CONNECT is read,
	// mochi replaces the deadline with the keepalive's.
	connectTimeout time.Duration
	// disconnect ends the established clients of this listener on Close.
	disconnect func(listenerID string)
	// tlsConfig, when set, makes this a TLS listener; the handshake runs
	// within connectTimeout, on the connection's own goroutine.
	tlsConfig *tls.Config
	// admit, when set, decides each accepted connection before anything
	// is read from it; a refused one is closed at once.
	admit func(remote net.Addr) bool

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	closed bool
	done   chan struct{}  // closed by Close
	wg     sync.WaitGroup // the accept loop and one goroutine per connection
}

var _ listeners.Listener = (*tcpListener)(nil)

// defaultConnectTimeout is how long a new connection may take to send
// CONNECT.
const defaultConnectTimeout = 10 * time.Second

func newTCPListener(id, address string) *tcpListener {
	return &tcpListener{id: id, address: address, connectTimeout: defaultConnectTimeout,
		conns: make(map[net.Conn]struct{}), done: make(chan struct{}), log: discardLogger}
}

// ID returns the listener's ID.
func (l *tcpListener) ID() string { return l.id }

// Protocol returns "tcp", or "tls" for a TLS listener.
func (l *tcpListener) Protocol() string {
	if l.tlsConfig != nil {
		return "tls"
	}
	return "tcp"
}

// Address returns the bound address once Init succeeded, else the
// configured one.
func (l *tcpListener) Address() string {
	if a := l.Addr(); a != nil {
		return a.String()
	}
	return l.address
}

// Addr returns the bound address, or nil before Init.
func (l *tcpListener) Addr() net.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln == nil {
		return nil
	}
	return l.ln.Addr()
}

// Init binds the listening socket.
func (l *tcpListener) Init(log *slog.Logger) error {
	if log != nil {
		l.log = log
	}
	ln, err := net.Listen("tcp", l.address)
	if err != nil {
		return fmt.Errorf("listen on %q: %w", l.address, err)
	}
	if l.tlsConfig != nil {
		ln = tls.NewListener(ln, l.tlsConfig)
	}
	l.mu.Lock()
	l.ln = ln
	l.mu.Unlock()
	return nil
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
		if l.admit != nil && !l.admit(conn.RemoteAddr()) {
			_ = conn.Close()
			continue
		}
		if !l.track(conn) {
			_ = conn.Close()
			return
		}
		_ = conn.SetReadDeadline(time.Now().Add(l.connectTimeout))
		go func() {
			defer l.untrack(conn)
			if err := establish(l.id, conn); err != nil {
				// Every ended session lands here (EOF, keepalive timeout,
				// a refused CONNECT): per-connection detail, not news.
				l.log.Debug("connection ended", "remote", conn.RemoteAddr().String(), "error", err)
			}
		}()
	}
}

// track registers an accepted connection; false after Close.
func (l *tcpListener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.conns[c] = struct{}{}
	l.wg.Add(1)
	return true
}

func (l *tcpListener) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	_ = c.Close()
	l.wg.Done()
}

func (l *tcpListener) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// Close stops accepting, disconnects this listener's clients (MQTT 5
// clients get DISCONNECT 0x8B), closes whatever is still open
// (connections still in CONNECT) and waits for all their goroutines.
// Calls after the first only wait.
func (l *tcpListener) Close(listeners.CloseFn) {
	l.mu.Lock()
	first := !l.closed
	l.closed = true
	ln := l.ln
	l.mu.Unlock()
	if first {
		close(l.done)
		if ln != nil {
			_ = ln.Close()
		}
		// Not mochi's closeClients: in v2.7.9 it read-locks the client
		// map twice (Clients.GetByListener calls Len), which deadlocks
		// Close when a client disconnects at the same moment.
		if l.disconnect != nil {
			// A DISCONNECT to a client that stopped reading waits for
			// the client's lock, held by mochi's write of an earlier
			// packet stuck on the full socket (no deadline with
			// keepalive 0): after disconnectGrace, closing the
			// connections ends those writes.
			forced := make(chan struct{})
			timer := time.AfterFunc(disconnectGrace, func() {
				defer close(forced)
				l.closeConns()
			})
			l.disconnect(l.id)
			if !timer.Stop() {
				<-forced
			}
		}
		l.closeConns()
	}
	l.wg.Wait()
}

// closeConns closes every connection still open.
func (l *tcpListener) closeConns() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		_ = c.Close()
	}
}
