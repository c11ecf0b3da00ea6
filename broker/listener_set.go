package broker

import (
	"fmt"
	"log/slog"
	"net"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/devicegate/devicegate/auth"
	"github.com/devicegate/devicegate/devicelimit"
)

// validateListeners checks the TLS, WebSocket, auth and limits options.
func (o *Options) validateListeners() error {
	switch {
	case o.TLSAddr != "" && o.TLS == nil:
		return fmt.Errorf("%w: TLSAddr is set but TLS is nil", ErrInvalidOptions)
	case o.WebSocketTLS && o.TLS == nil:
		return fmt.Errorf("%w: WebSocketTLS is set but TLS is nil", ErrInvalidOptions)
	case o.Auth.Certificates && (o.TLS == nil || o.TLS.ClientCAs == nil):
		return fmt.Errorf("%w: Auth.Certificates needs TLS with ClientCAs to verify client certificates", ErrInvalidOptions)
	case !o.Auth.AllowAll() && o.Auth.ACL.IsZero():
		return fmt.Errorf("%w: Auth.ACL is required when clients are authenticated", ErrInvalidOptions)
	}
	return o.Limits.validate()
}

// newAuthHook builds the auth hook; logs is the throttle's log limiter,
// which it shares (its lines are of kinds logRefused and logProtocol)
// and which the throttle sweeps.
func newAuthHook(srv *mqtt.Server, opts Options, log *slog.Logger, logs *logLimiter, conns *registry, blocked *blocks) (*authHook, error) {
	var err error
	h := &authHook{srv: srv, opts: opts.Auth, limits: opts.Limits, table: opts.Table, identity: opts.Identity,
		clock: opts.Clock, log: log, logs: logs, conns: conns, blocks: blocked, pending: newPendingGate(opts.Limits.MaxPendingConnections, opts.Limits.MaxPendingPerAddress)}
	h.creds.Store(opts.Auth.Credentials)
	acl := opts.Auth.ACL
	h.acl.Store(&acl)
	h.ownClients = srv.Clients.Len()
	h.consumers = newConsumerSet(opts.Limits)
	h.connect.Store(&connectRate{quota: opts.Limits.ConnectRate, exempt: opts.Limits.ConnectRateExempt})
	// Made even without a rate: a reload may set one.
	if h.rate, err = devicelimit.NewTable(auth.ConnectRateBuckets); err != nil {
		return nil, fmt.Errorf("connect rate: %w", err)
	}
	return h, nil
}

// startListeners binds the configured listeners and starts serving;
// on failure nothing is left listening.
func (s *Server) startListeners() error {
	var added []listeners.Listener
	undo := func() {
		for _, l := range added {
			l.Close(func(string) {})
			s.mqtt.Listeners.Delete(l.ID())
		}
	}
	add := func(l listeners.Listener) error {
		if err := s.mqtt.AddListener(l); err != nil { // binds (Init)
			undo()
			return fmt.Errorf("start mqtt: %w", err)
		}
		added = append(added, l)
		return nil
	}
	tcp := func(id, addr string) *tcpListener {
		l := newTCPListener(id, addr)
		if s.connectTimeout > 0 {
			l.connectTimeout = s.connectTimeout
		}
		l.disconnect = s.disconnectClients
		l.admit = s.auth.admitConn
		l.pending, l.silentClosed = s.auth.pending, s.auth.silentClosed
		l.protocolRefused = s.auth.protocolRefused
		return l
	}
	var tcpL, tlsL *tcpListener
	var wsL *wsListener
	if s.opts.TCPAddr != "" {
		tcpL = tcp("tcp", s.opts.TCPAddr)
		if err := add(tcpL); err != nil {
			return err
		}
	}
	if s.opts.TLSAddr != "" {
		tlsL = tcp("tls", s.opts.TLSAddr)
		tlsL.tlsConfig = s.opts.TLS
		if err := add(tlsL); err != nil {
			return err
		}
	}
	if s.opts.WebSocketAddr != "" {
		wsL = newWSListener("ws", s.opts.WebSocketAddr)
		if s.connectTimeout > 0 {
			wsL.connectTimeout = s.connectTimeout
		}
		wsL.disconnect = s.disconnectClients
		wsL.admit = s.auth.admitConn
		wsL.pending, wsL.silentClosed = s.auth.pending, s.auth.silentClosed
		wsL.protocolRefused = s.auth.protocolRefused
		wsL.maxFrame = int64(s.opts.Limits.MaxPacketSize)
		if s.opts.WebSocketTLS {
			wsL.tlsConfig = s.opts.TLS
		}
		if err := add(wsL); err != nil {
			return err
		}
	}
	if err := s.mqtt.Serve(); err != nil {
		// Serve fails only on configured stores, hooks or listeners,
		// which this server has none of; undo the binds all the same.
		undo()
		return fmt.Errorf("start mqtt: %w", err)
	}
	s.tcp, s.tls, s.ws = tcpL, tlsL, wsL
	return nil
}

// TLSAddr returns the bound address of the TLS listener, or nil when
// there is none or before a successful Start.
func (s *Server) TLSAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tls == nil {
		return nil
	}
	return s.tls.Addr()
}

// WebSocketAddr returns the bound address of the WebSocket listener, or
// nil when there is none or before a successful Start.
func (s *Server) WebSocketAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ws == nil {
		return nil
	}
	return s.ws.Addr()
}

// SetCredentials replaces the accounts that authenticate clients from
// now on; connected clients stay connected. It is an error when the
// server was built without Auth.Credentials (the auth mode does not
// change at runtime) or c is nil.
func (s *Server) SetCredentials(c *auth.Credentials) error {
	if s.opts.Auth.Credentials == nil || c == nil {
		return fmt.Errorf("%w: SetCredentials needs a server built with Auth.Credentials, and accounts", ErrInvalidOptions)
	}
	s.auth.creds.Store(c)
	return nil
}

// AuthStats returns the counts of refusals by the topic ACL, at CONNECT
// and by the connection rate limit.
func (s *Server) AuthStats() AuthStats { return s.auth.stats() }
