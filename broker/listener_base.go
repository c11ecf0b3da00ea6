package broker

import (
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/mochi-mqtt/server/v2/listeners"
)

// listenerBase is what the TCP and the WebSocket listeners share: their
// identity, the bound socket (wrapped so refused addresses are closed as
// they are accepted, and in TLS when configured), the connections they
// track, and a Close that disconnects clients and then closes what is
// left.
type listenerBase struct {
	id, address string
	log         *slog.Logger
	// connectTimeout bounds the wait for a new connection's CONNECT (and
	// its TLS handshake or WebSocket upgrade). mochi reads CONNECT
	// without any deadline, so a socket that never sends one would hold
	// a goroutine forever; once CONNECT is read, mochi replaces the
	// deadline with the keepalive's.
	connectTimeout time.Duration
	// disconnect ends the established clients of this listener on Close.
	disconnect func(listenerID string)
	// tlsConfig, when set, serves TLS; the handshake runs within
	// connectTimeout, on the connection's own goroutine.
	tlsConfig *tls.Config
	// admit, when set, decides each accepted connection before anything
	// is read from it; a refused one is closed at once.
	admit func(remote net.Addr) bool
	// pending, when set, bounds the connections not yet past CONNECT;
	// silentClosed counts one closed for it (pending.go: why).
	pending      *pendingGate
	silentClosed func(why int)
	// protocolRefused, when set, counts and logs a connection ended for
	// a packet the MQTT specification forbids (protocheck.go).
	protocolRefused func(remote string, atConnect bool, reason string)

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup // the serving goroutine and one per connection
}

func newListenerBase(id, address string) listenerBase {
	return listenerBase{id: id, address: address, log: discardLogger, connectTimeout: defaultConnectTimeout,
		conns: make(map[net.Conn]struct{})}
}

// ID returns the listener's ID.
func (l *listenerBase) ID() string { return l.id }

// Address returns the bound address once Init succeeded, else the
// configured one.
func (l *listenerBase) Address() string {
	if a := l.Addr(); a != nil {
		return a.String()
	}
	return l.address
}

// Addr returns the bound address, or nil before Init.
func (l *listenerBase) Addr() net.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln == nil {
		return nil
	}
	return l.ln.Addr()
}

// Init binds the listening socket.
func (l *listenerBase) Init(log *slog.Logger) error {
	if log != nil {
		l.log = log
	}
	ln, err := net.Listen("tcp", l.address)
	if err != nil {
		return &ListenError{Listener: l.id, Addr: l.address, Err: err}
	}
	var wrapped net.Listener = admitListener{ln, l.admit}
	if l.tlsConfig != nil {
		wrapped = tls.NewListener(wrapped, l.tlsConfig)
	}
	l.mu.Lock()
	l.ln = wrapped
	l.mu.Unlock()
	return nil
}

// track registers an accepted connection; false after Close. The caller
// closes an untracked connection. A silent connection the new one takes
// the place of (pending.go) is closed.
func (l *listenerBase) track(c net.Conn) bool {
	if l.pending != nil {
		if victim, why := l.pending.acquire(c); victim != nil {
			_ = victim.Close()
			if l.silentClosed != nil {
				l.silentClosed(why)
			}
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		if l.pending != nil {
			l.pending.release(c.RemoteAddr().String())
		}
		return false
	}
	l.conns[c] = struct{}{}
	l.wg.Add(1)
	return true
}

// serve hands c to mochi, its reads checked (protocheck.go), and once
// mochi is done with it waits for its write spool, if it has one, to
// write what is pending and close.
//
// mochi gets the connection only once its first byte has arrived: until
// then a silent connection costs a parked goroutine, not a mochi client
// (its buffers and writer goroutine), and a flood of them puts no work
// ahead of a device's CONNECT.
func (l *listenerBase) serve(establish listeners.EstablishFn, c net.Conn) error {
	pc := &protoConn{Conn: c, refused: l.protocolRefused}
	defer pc.ended()
	var first [1]byte
	if n, err := c.Read(first[:]); n == 0 {
		if err == nil {
			err = io.ErrNoProgress
		}
		return err
	}
	pc.first, pc.hasFirst = first[0], true
	return establish(l.id, pc)
}

// untrack closes a tracked connection and forgets it; err is how its
// serving ended. One that never sent CONNECT and ended by its deadline
// is counted (silentTimeout).
func (l *listenerBase) untrack(c net.Conn, err error) {
	if l.pending != nil && l.pending.release(c.RemoteAddr().String()) &&
		errors.Is(err, os.ErrDeadlineExceeded) && l.silentClosed != nil {
		l.silentClosed(silentTimeout)
	}
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	_ = c.Close()
	l.wg.Done()
}

func (l *listenerBase) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// markClosed marks the listener closed and reports whether this was the
// first call.
func (l *listenerBase) markClosed() (first bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	first = !l.closed
	l.closed = true
	return first
}

// endConns disconnects this listener's clients (MQTT 5 clients get
// DISCONNECT 0x8B), then closes whatever is still open (connections
// still in CONNECT).
func (l *listenerBase) endConns() {
	// Not mochi's closeClients: in v2.7.9 it read-locks the client map
	// twice (Clients.GetByListener calls Len), which deadlocks Close when
	// a client disconnects at the same moment.
	if l.disconnect != nil {
		// A DISCONNECT to a client that stopped reading waits for the
		// client's lock, held by mochi's write of an earlier packet stuck
		// on the full socket (no deadline with keepalive 0): after
		// disconnectGrace, closing the connections ends those writes.
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

// closeConns closes every connection still open.
func (l *listenerBase) closeConns() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		_ = c.Close()
	}
}

// admitListener closes the connections admit refuses as they are
// accepted.
type admitListener struct {
	net.Listener
	admit func(net.Addr) bool
}

func (a admitListener) Accept() (net.Conn, error) {
	for {
		c, err := a.Listener.Accept()
		if err != nil || a.admit == nil || a.admit(c.RemoteAddr()) {
			return c, err
		}
		_ = c.Close()
	}
}
