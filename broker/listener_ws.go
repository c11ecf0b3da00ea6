package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/mochi-mqtt/server/v2/listeners"
)

// wsListener is a mochi listeners.Listener for MQTT over WebSocket
// (subprotocol "mqtt", binary frames), optionally over TLS. It replaces
// mochi's listeners.Websocket, which cannot report a port picked with
// ":0", reads frames without a size limit, and leaves upgraded
// connections open after Close.
type wsListener struct {
	id, address    string
	log            *slog.Logger
	tlsConfig      *tls.Config
	admit          func(remote net.Addr) bool
	disconnect     func(listenerID string)
	connectTimeout time.Duration
	// maxFrame bounds one WebSocket message; 0 means no bound.
	maxFrame int64

	mu     sync.Mutex
	ln     net.Listener
	http   *http.Server
	conns  map[net.Conn]struct{} // upgraded connections
	closed bool
	wg     sync.WaitGroup // Serve and one per upgraded connection
}

var _ listeners.Listener = (*wsListener)(nil)

func newWSListener(id, address string) *wsListener {
	return &wsListener{id: id, address: address, log: discardLogger, connectTimeout: defaultConnectTimeout,
		conns: make(map[net.Conn]struct{})}
}

// ID returns the listener's ID.
func (l *wsListener) ID() string { return l.id }

// Protocol returns "ws", or "wss" over TLS.
func (l *wsListener) Protocol() string {
	if l.tlsConfig != nil {
		return "wss"
	}
	return "ws"
}

// Address returns the bound address once Init succeeded.
func (l *wsListener) Address() string {
	if a := l.Addr(); a != nil {
		return a.String()
	}
	return l.address
}

// Addr returns the bound address, or nil before Init.
func (l *wsListener) Addr() net.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln == nil {
		return nil
	}
	return l.ln.Addr()
}

// Init binds the listening socket.
func (l *wsListener) Init(log *slog.Logger) error {
	if log != nil {
		l.log = log
	}
	ln, err := net.Listen("tcp", l.address)
	if err != nil {
		return fmt.Errorf("listen on %q: %w", l.address, err)
	}
	var inner net.Listener = admitListener{ln, l.admit}
	if l.tlsConfig != nil {
		inner = tls.NewListener(inner, l.tlsConfig)
	}
	l.mu.Lock()
	l.ln = inner
	l.mu.Unlock()
	return nil
}

// Serve serves HTTP upgrades until Close.
func (l *wsListener) Serve(establish listeners.EstablishFn) {
	up := &websocket.Upgrader{
		Subprotocols:     []string{"mqtt"},
		HandshakeTimeout: l.connectTimeout,
		// Devices are not browsers: there is no page origin to check,
		// and credentials, not cookies, authenticate a client.
		CheckOrigin: func(*http.Request) bool { return true },
	}
	l.mu.Lock()
	if l.closed || l.ln == nil {
		l.mu.Unlock()
		return
	}
	l.http = &http.Server{
		ReadHeaderTimeout: l.connectTimeout,
		ErrorLog:          slog.NewLogLogger(l.log.Handler(), slog.LevelDebug),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, err := up.Upgrade(w, r, nil) // writes the HTTP error itself
			if err != nil {
				return
			}
			if l.maxFrame > 0 {
				c.SetReadLimit(l.maxFrame)
			}
			conn := &wsConn{Conn: c.NetConn(), c: c}
			if !l.track(conn.Conn) {
				_ = conn.Close()
				return
			}
			defer l.untrack(conn.Conn)
			_ = conn.SetReadDeadline(time.Now().Add(l.connectTimeout))
			if err := establish(l.id, conn); err != nil {
				l.log.Debug("connection ended", "remote", r.RemoteAddr, "error", err)
			}
		}),
	}
	srv, ln := l.http, l.ln
	l.wg.Add(1)
	l.mu.Unlock()
	defer l.wg.Done()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		l.log.Error("websocket listener stopped", "addr", ln.Addr().String(), "error", err)
	}
}

func (l *wsListener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.conns[c] = struct{}{}
	l.wg.Add(1)
	return true
}

func (l *wsListener) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	_ = c.Close()
	l.wg.Done()
}

// Close stops accepting, disconnects this listener's clients, closes
// what is still open and waits for the connections' goroutines.
func (l *wsListener) Close(listeners.CloseFn) {
	l.mu.Lock()
	first := !l.closed
	l.closed = true
	srv, ln := l.http, l.ln
	l.mu.Unlock()
	if first {
		if srv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), disconnectGrace)
			_ = srv.Shutdown(ctx) // hijacked connections are ours to close
			cancel()
		} else if ln != nil {
			_ = ln.Close()
		}
		if l.disconnect != nil {
			l.disconnect(l.id)
		}
		l.mu.Lock()
		for c := range l.conns {
			_ = c.Close()
		}
		l.mu.Unlock()
	}
	l.wg.Wait()
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

// wsConn is an upgraded WebSocket connection as a byte stream: reads
// run across binary messages, each write is one binary message.
type wsConn struct {
	net.Conn // the underlying connection, for addresses and deadlines
	c        *websocket.Conn
	r        io.Reader  // the current message; nil between messages
	wmu      sync.Mutex // websocket.Conn takes one writer at a time
}

func (ws *wsConn) Read(p []byte) (int, error) {
	for {
		if ws.r == nil {
			op, r, err := ws.c.NextReader()
			if err != nil {
				return 0, err
			}
			if op != websocket.BinaryMessage {
				return 0, listeners.ErrInvalidMessage
			}
			ws.r = r
		}
		n, err := ws.r.Read(p)
		if errors.Is(err, io.EOF) {
			ws.r, err = nil, nil
			if n == 0 {
				continue
			}
		}
		return n, err
	}
}

func (ws *wsConn) Write(p []byte) (int, error) {
	ws.wmu.Lock()
	defer ws.wmu.Unlock()
	if err := ws.c.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (ws *wsConn) Close() error { return ws.c.Close() }
