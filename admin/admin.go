// Package admin serves the gateway's HTTP admin API (quota overrides and
// device status under /api/v1, authenticated with a bearer token), the
// Prometheus /metrics endpoint, the /healthz liveness probe and, when
// Options.Console is set, the operator console under /ui/ (package
// admin/console), which works through the API.
//
// The package knows the domain (devicelimit) but not the broker or the
// store: main adapts those to the small interfaces declared here.
package admin

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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/devicegate/devicegate/devicelimit"
)

// Overrides changes runtime quota overrides durably. SetOverride
// validates, makes the override durable, then puts it in force; its
// errors wrap devicelimit.ErrInvalidQuota, ErrInvalidPolicy or
// ErrInvalidDevice for bad input. main implements it with persist.Store
// and the Resolver.
type Overrides interface {
	SetOverride(device string, o devicelimit.Override) error
	DeleteOverride(device string) (bool, error)
}

// DeviceStatus is what the broker knows about a device.
type DeviceStatus struct {
	Connected bool
	// ClientID and Username are those of a live connection (for rule
	// matching), "" when not connected.
	ClientID, Username string
	// LastSeen is the device's last activity, 0 when unknown.
	LastSeen devicelimit.Tick
	// Deferred is the number of messages queued for the device.
	Deferred int
	// BlockedUntil is the end of the device's block, 0 when none.
	BlockedUntil devicelimit.Tick
	// Remote, Protocol and Since are the live connection's remote
	// address, MQTT protocol version and start; zero without one.
	Remote   string
	Protocol byte
	Since    devicelimit.Tick
}

// Devices reports a device's connection and queue state.
type Devices interface {
	Status(device string) DeviceStatus
}

// ThrottledDevice is one entry of Throttled.Top.
type ThrottledDevice struct {
	Device  string
	Refused uint64
}

// Throttled lists the devices refused most.
type Throttled interface {
	Top(n int) []ThrottledDevice
}

// Options configures a Server. Token, Table, Resolver, Clock, Overrides
// and Registry are required; Devices and Throttled default to reporting
// nothing, Logger to discarding.
type Options struct {
	Addr      string // "127.0.0.1:8080"; ":0" style ports allowed
	Token     string // bearer token for /api routes, non-empty
	Table     *devicelimit.Table
	Resolver  *devicelimit.Resolver
	Identity  devicelimit.Identity
	Clock     devicelimit.Clock
	Overrides Overrides
	Devices   Devices
	Throttled Throttled
	Registry  *prometheus.Registry // served at /metrics
	Logger    *slog.Logger
	// Windows, when not nil, is where device status and reset read
	// and empty windows instead of Table (windows shared in Redis).
	Windows Windows
	// TLSCertFile and TLSKeyFile, when both set, serve HTTPS (TLS 1.2
	// at least) with that PEM certificate and key.
	TLSCertFile, TLSKeyFile string
	// Health, when not nil, is asked at every GET /healthz; a non-nil
	// error makes it answer 503 with the error's message.
	Health func() error
	// Forward, when not nil, reports each upstream's forwarding state
	// (GET /api/v1/forward).
	Forward func() []ForwardStats
	// Dead lists, replays and drops the upstreams' dead letters; nil:
	// no upstream.
	Dead DeadLetters
	// Blocks lists and lifts automatic blocks; nil: none.
	Blocks Blocks
	// Groups lists the groups devices joined since start (in a cluster,
	// on any gateway); nil: none.
	Groups Groups
	// Listing lists the devices tracked (GET /api/v1/devices) and their
	// recent refusals; nil: none.
	Listing DeviceLister
	// Stats, when not nil, is sampled every RateInterval for GET
	// /api/v1/rates.
	Stats StatsSource
	// Console, when not nil, is served under /ui/ (the operator
	// console, package admin/console).
	Console http.Handler
	// NoDefer, when not "", refuses a device's quota override with
	// policy defer, its own or a class's, answering 400 with this reason
	// (cluster.decisions: owner, config.OwnerNoDefer).
	NoDefer string
	// Backup writes a consistent copy of the data file to w and returns
	// the bytes written (GET /api/v1/backup); nil: the route answers 404.
	Backup func(w io.Writer) (int64, error)
	// Reload reads the configuration again and puts it in force (POST
	// /api/v1/reload): the keys changed, or an error wrapping
	// ErrReloadRefused (a key that needs a restart changed) or another
	// (the file is bad); nil: the route answers 404.
	Reload func() ([]ReloadChange, error)
	// Deferred returns the first n of a device's deferred messages, in
	// the order they were deferred, and how many it has (GET
	// /api/v1/devices/{id}/deferred); nil: none.
	Deferred func(device string, n int) ([]DeferredMessage, int)
	// Next judges a device's next message now, as the broker would,
	// reading windows with peek (Windows.PeekAllAt); nil: the device
	// status has no "next".
	Next func(device string, peek func(device, class string, ls []devicelimit.Limit, size int, now devicelimit.Tick) (devicelimit.Verdict, error)) ([]NextMessage, error)
	// History returns a device's recent outcomes, nil when none are
	// kept; nil: no device history (GET /api/v1/devices/{id}/history
	// answers 404).
	History func(device string) (DeviceHistory, bool)
}

// Blocks lists the devices blocked now, reads one device's block and
// lifts a block.
type Blocks interface {
	Blocked() []BlockedDevice
	Block(device string) (BlockedDevice, bool)
	Unblock(device string) (bool, error)
}

// BlockedDevice is a device's block, in force from Since until Until,
// for Reason; Since is 0 and Reason "" when the gateway does not know
// them (a block stored by an earlier version, or made by another
// gateway of a cluster).
type BlockedDevice struct {
	Device string
	Until  devicelimit.Tick
	Since  devicelimit.Tick
	Reason string
}

// Server is the admin HTTP server. Create it with New; Handler serves
// without listening, Start listens on Options.Addr. Safe for concurrent
// use.
type Server struct {
	opts    Options
	log     *slog.Logger
	handler http.Handler

	metricsHandler http.Handler

	rateRing   rateRing
	fwdHistory fwdHistory

	mu         sync.Mutex
	fresh      map[net.Conn]struct{} // connections with no request read yet
	srv        *http.Server
	ln         net.Listener
	done       chan struct{}
	stopRates  chan struct{}
	ratesEnded chan struct{}
}

// New checks opts and builds the server's handler.
func New(opts Options) (*Server, error) {
	switch {
	case opts.Token == "":
		return nil, errors.New("admin: empty token")
	case opts.Table == nil:
		return nil, errors.New("admin: nil Table")
	case opts.Resolver == nil:
		return nil, errors.New("admin: nil Resolver")
	case opts.Clock == nil:
		return nil, errors.New("admin: nil Clock")
	case opts.Overrides == nil:
		return nil, errors.New("admin: nil Overrides")
	case opts.Registry == nil:
		return nil, errors.New("admin: nil Registry")
	}
	if opts.Devices == nil {
		opts.Devices = noDevices{}
	}
	if opts.Throttled == nil {
		opts.Throttled = noThrottled{}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{opts: opts, log: log}
	s.metricsHandler = promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{ErrorLog: slogPrinter{log}})
	s.handler = s.checkPaths(s.newMux())
	return s, nil
}

type noDevices struct{}

func (noDevices) Status(string) DeviceStatus { return DeviceStatus{} }

type noThrottled struct{}

func (noThrottled) Top(int) []ThrottledDevice { return nil }

// Handler returns the server's routes, for httptest or another server.
func (s *Server) Handler() http.Handler { return s.handler }

// Start listens on Options.Addr and serves in the background. It
// returns once the listener is bound; Addr then reports the real address.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return errors.New("admin: already started")
	}
	var tlsConfig *tls.Config
	if s.opts.TLSCertFile != "" || s.opts.TLSKeyFile != "" {
		cert, err := tls.LoadX509KeyPair(s.opts.TLSCertFile, s.opts.TLSKeyFile)
		if err != nil {
			return fmt.Errorf("admin: tls: %w", err)
		}
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	}
	ln, err := net.Listen("tcp", s.opts.Addr)
	if err != nil {
		return fmt.Errorf("admin: listen on %q: %w", s.opts.Addr, err)
	}
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	} else {
		ln = jsonBadRequests{ln} // badrequest.go
	}
	s.ln = ln
	s.srv = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		ConnState:         s.connState,
	}
	s.fresh = map[net.Conn]struct{}{}
	s.done = make(chan struct{})
	if s.opts.Stats != nil {
		s.rateTick() // the first sample: rates from the next
		s.stopRates, s.ratesEnded = make(chan struct{}), make(chan struct{})
		go func(stop, ended chan struct{}) {
			defer close(ended)
			s.sampleRates(stop)
		}(s.stopRates, s.ratesEnded)
	}
	srv, done := s.srv, s.done
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("admin server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	return nil
}

// connState keeps the set of connections with no request read yet.
func (s *Server) connState(c net.Conn, st http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st == http.StateNew {
		s.fresh[c] = struct{}{}
	} else {
		delete(s.fresh, c)
	}
}

// Addr returns the listener's address, nil before Start.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Close stops the server gracefully, waiting for requests in flight
// until ctx ends, then closes what remains. Safe to call when Start was
// never called or failed, and more than once.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	srv, done := s.srv, s.done
	stopRates, ratesEnded := s.stopRates, s.ratesEnded
	s.stopRates = nil
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	if stopRates != nil {
		close(stopRates)
		<-ratesEnded
	}
	// A connection a browser opened ahead of a request it may never
	// send is not idle to Shutdown for its first 5 seconds: closed now,
	// it holds up no shutdown.
	srv.SetKeepAlivesEnabled(false)
	s.mu.Lock()
	for c := range s.fresh {
		c.Close()
	}
	s.mu.Unlock()
	err := srv.Shutdown(ctx)
	if err != nil {
		srv.Close()
	}
	<-done
	if err != nil {
		return fmt.Errorf("admin: shutdown: %w", err)
	}
	return nil
}
