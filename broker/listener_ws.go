package broker

import (
	"context"
	"errors"
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
	listenerBase
	// maxFrame bounds one WebSocket message; 0 means no bound.
	maxFrame int64
	http     *http.Server // guarded by mu
}

var _ listeners.Listener = (*wsListener)(nil)

func newWSListener(id, address string) *wsListener {
	return &wsListener{listenerBase: newListenerBase(id, address)}
}

// Protocol returns "ws", or "wss" over TLS.
func (l *wsListener) Protocol() string {
	if l.tlsConfig != nil {
		return "wss"
	}
	return "ws"
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
			var served error
			defer func() { l.untrack(conn.Conn, served) }()
			_ = conn.SetReadDeadline(time.Now().Add(l.connectTimeout))
			if served = l.serve(establish, conn); served != nil {
				l.log.Debug("connection ended", "remote", r.RemoteAddr, "error", served)
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

// Close stops accepting, disconnects this listener's clients, closes
// what is still open and waits for the connections' goroutines.
func (l *wsListener) Close(listeners.CloseFn) {
	if l.markClosed() {
		l.mu.Lock()
		srv, ln := l.http, l.ln
		l.mu.Unlock()
		if srv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), disconnectGrace)
			_ = srv.Shutdown(ctx) // hijacked connections are ours to close
			cancel()
		} else if ln != nil {
			_ = ln.Close()
		}
		l.endConns()
	}
	l.wg.Wait()
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
