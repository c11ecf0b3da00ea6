package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/topk"
)

// DefaultSweepInterval is how often idle windows are evicted when
// Options.SweepInterval is 0.
const DefaultSweepInterval = 10 * time.Second

// Options configure a Server. Table, Resolver and Clock are required.
type Options struct {
	// TCPAddr is the MQTT listen address, e.g. ":1883"; "127.0.0.1:0"
	// picks a free port (see Server.Addr).
	TCPAddr string
	// Table holds the device windows.
	Table *devicelimit.Table
	// Resolver gives each device its quota. It must validate quotas for
	// Table's bucket count.
	Resolver *devicelimit.Resolver
	// Clock is the logical clock every decision is taken at.
	Clock devicelimit.Clock
	// Identity says which MQTT field names a device: the client ID (the
	// zero value) or the username.
	Identity devicelimit.Identity
	// Logger receives the gateway's and mochi's logs; nil discards them.
	Logger *slog.Logger
	// SweepInterval is how often idle windows are evicted (Table.Sweep)
	// and expired overrides pruned; 0 means DefaultSweepInterval.
	SweepInterval time.Duration
	// Defer stores deferred messages. It is needed when any quota may
	// have policy defer; without it, policy defer drops like policy drop.
	// It must stay open until Close has returned.
	Defer DeferStore
	// DeferLimits bound the deferral queue; zero fields take defaults.
	DeferLimits DeferLimits
	// Blocks stores automatic blocks (quotas with a Block); without it
	// blocks last until the process ends.
	Blocks BlockStore
	// Sessions stores the sessions of clients that keep one and the
	// commands (Publish) queued in them, restored at Start; without it
	// they last until the process ends.
	Sessions SessionStore
	// Throttled, when not nil, records every refused publish (dropped,
	// disconnected, or refused by a full or failed deferral) by device
	// at its decision instant. Admitted and deferred publishes are not
	// recorded.
	Throttled *topk.Tracker
	// Forward, when set, takes every admitted message (and every
	// released deferred one) for the upstreams (forward.Set): it returns
	// once the upstreams' forward logs hold it durably, and the device is
	// acknowledged only then.
	Forward Forwarder
	// Limiter, when not nil, takes the publish and release decisions
	// instead of Table, for example windows shared in Redis
	// (cluster.Limiter). Table still holds this process's windows
	// (snapshots, the admin API, a limiter's local fallback). Its bucket
	// count must be Table's.
	Limiter Limiter
	// TLSAddr, when not empty, is the address of an MQTT listener over
	// TLS with the configuration TLS (TLS 1.2 at least).
	TLSAddr string
	TLS     *tls.Config
	// WebSocketAddr, when not empty, is the address of an MQTT over
	// WebSocket listener; over TLS (wss) when WebSocketTLS is set, with
	// the configuration TLS.
	WebSocketAddr string
	WebSocketTLS  bool
	// Auth authenticates clients and sets the topic ACL; the zero value
	// is allow-all.
	Auth Auth
	// Limits bound what clients can take; zero fields are no bound.
	Limits Limits
	// GroupJoined, when set, is told of each group the first time one
	// of this broker's devices joins it (a cluster shares them:
	// cluster.GroupRegistry). It runs as the device connects: it must
	// not wait.
	GroupJoined func(devicelimit.Membership)
}

func (o *Options) validate() error {
	switch {
	case o.TCPAddr == "" && o.TLSAddr == "" && o.WebSocketAddr == "":
		return fmt.Errorf("%w: TCPAddr, TLSAddr and WebSocketAddr are all empty", ErrInvalidOptions)
	case o.Table == nil:
		return fmt.Errorf("%w: Table is nil", ErrInvalidOptions)
	case o.Resolver == nil:
		return fmt.Errorf("%w: Resolver is nil", ErrInvalidOptions)
	case o.Clock == nil:
		return fmt.Errorf("%w: Clock is nil", ErrInvalidOptions)
	case o.Identity != devicelimit.IdentityClientID && o.Identity != devicelimit.IdentityUsername:
		return fmt.Errorf("%w: Identity: unknown identity %d", ErrInvalidOptions, o.Identity)
	case o.SweepInterval < 0:
		return fmt.Errorf("%w: SweepInterval must be >= 0 (got %q)", ErrInvalidOptions, o.SweepInterval.String())
	case o.Limiter != nil && o.Limiter.Buckets() != o.Table.Buckets():
		return fmt.Errorf("%w: Limiter has %d buckets but Table has %d", ErrInvalidOptions, o.Limiter.Buckets(), o.Table.Buckets())
	case o.Table.Buckets() != o.Resolver.Buckets():
		// A quota valid for fewer buckets may give buckets shorter than
		// the table accepts, and the table refuses every message.
		return fmt.Errorf("%w: Table has %d buckets but Resolver validates quotas for %d",
			ErrInvalidOptions, o.Table.Buckets(), o.Resolver.Buckets())
	}
	if err := o.validateListeners(); err != nil {
		return err
	}
	return o.DeferLimits.validate()
}

// Server is the gateway's MQTT broker. Build it with New, then Start it;
// Close stops it. Its methods are safe for concurrent use.
type Server struct {
	opts Options
	mqtt *mqtt.Server
	hook *throttle
	def  *deferrer // nil without Options.Defer
	// releaser is the inline client that publishes released messages
	// as their device. Only release rounds use it, one at a time.
	releaser *mqtt.Client
	// sessions keeps the kept sessions (keptsessions.go); commander is the
	// inline client that publishes commands.
	sessions  *sessionHook
	commander *mqtt.Client

	auth     *authHook
	takeover *takeoverHook
	mlog     *mochiLimits // what mochi's log handler counts and holds back

	mu       sync.Mutex
	tcp      *tcpListener // set once the listener is bound
	tls      *tcpListener // the TLS listener, when bound
	ws       *wsListener  // the WebSocket listener, when bound
	started  bool
	closing  bool
	stop     chan struct{} // closed to end the sweep loop
	loopDone chan struct{} // closed when the sweep loop has ended
	// The release loop and the deleter of released messages, when
	// there is a DeferStore.
	releaseStop, releaseDone chan struct{}
	deleteStop, deleteDone   chan struct{}

	closeOnce sync.Once
	closed    chan struct{} // closed when Close has finished

	connectTimeout time.Duration // for tests; 0 means defaultConnectTimeout
	// noReleaseLoop, for tests, leaves release rounds to the test
	// (releaseTick) so that they happen only at instants it chooses.
	noReleaseLoop bool
}

// New validates opts and builds a server; nothing listens until Start.
// Errors wrap ErrInvalidOptions and name the field.
func New(opts Options) (*Server, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts.SweepInterval == 0 {
		opts.SweepInterval = DefaultSweepInterval
	}
	log := opts.Logger
	if log == nil {
		log = discardLogger
	}
	logs, err := newLogLimiter(opts.Clock)
	if err != nil {
		return nil, fmt.Errorf("log limiter: %w", err)
	}
	wills, err := newWillAllowance()
	if err != nil {
		return nil, fmt.Errorf("will allowance: %w", err)
	}
	mlog := &mochiLimits{logs: logs}
	srv := mqtt.New(&mqtt.Options{
		// The inline client lets the gateway publish (deferred releases);
		// the throttle hook never counts its messages.
		InlineClient: true,
		Logger:       slog.New(mochiHandler{log.Handler(), mlog}).With("component", "mochi"),
		Capabilities: opts.Limits.capabilities(),
	})
	h := &throttle{
		srv:      srv,
		table:    opts.Table,
		limiter:  limiterOf(&opts),
		prelease: opts.Limiter == nil && opts.Table != nil && opts.Table.Leases(),
		resolver: opts.Resolver,
		clock:    opts.Clock,
		identity: opts.Identity,
		log:      log,
		logs:     logs,
		wills:    wills,
		conns:    new(registry),

		devices:   make(map[string]*devState),
		throttled: opts.Throttled,
		fwd:       opts.Forward,
	}
	if h.fwd != nil {
		h.inlines = newInlinePool(srv)
	}
	h.refusals = map[string]*[3]atomic.Uint64{"": new([3]atomic.Uint64), OverrideClass: new([3]atomic.Uint64)}
	if opts.Resolver != nil {
		for _, c := range opts.Resolver.ClassNames() {
			h.refusals[c] = new([3]atomic.Uint64)
		}
	}
	h.wouldRefuseByRule = map[string]*atomic.Uint64{"": new(atomic.Uint64)}
	if opts.Resolver != nil {
		for _, r := range opts.Resolver.RuleNames() {
			h.wouldRefuseByRule[r] = new(atomic.Uint64)
		}
	}
	h.groups = newGroupStats(opts.Resolver)
	h.groupJoined = opts.GroupJoined
	h.blocks = newBlocks(opts.Blocks, opts.Resolver.MayBlock, log)
	ah, err := newAuthHook(srv, opts, log, logs, h.conns, h.blocks)
	if err != nil {
		return nil, err
	}
	h.consumers = ah.consumers
	h.remaps = &ah.remaps
	// First: the other hooks' OnSessionEstablish and OnDisconnect run
	// once a takeover is done (takeover.go).
	th := newTakeoverHook(srv)
	if err := srv.AddHook(th, nil); err != nil {
		return nil, fmt.Errorf("add takeover hook: %w", err)
	}
	if err := srv.AddHook(ah, nil); err != nil {
		return nil, fmt.Errorf("add auth hook: %w", err)
	}
	if err := srv.AddHook(h, nil); err != nil {
		return nil, fmt.Errorf("add throttle hook: %w", err)
	}
	if err := srv.AddHook(&willHook{t: h}, nil); err != nil {
		return nil, fmt.Errorf("add will hook: %w", err)
	}
	if err := srv.AddHook(newStatusHook(h), nil); err != nil {
		return nil, fmt.Errorf("add status hook: %w", err)
	}
	if err := addClaimHook(srv, limiterOf(&opts), h.conns, log); err != nil {
		return nil, fmt.Errorf("add cluster claim hook: %w", err)
	}
	sh := newSessionHook(srv, opts.Sessions, h.conns, log)
	ah.kept = sh
	if err := srv.AddHook(sh, nil); err != nil {
		return nil, fmt.Errorf("add sessions hook: %w", err)
	}
	s := &Server{opts: opts, mqtt: srv, hook: h, auth: ah, takeover: th, mlog: mlog, closed: make(chan struct{}), sessions: sh,
		commander: srv.NewClient(nil, commandListener, commandOrigin, true)}
	if opts.Defer != nil {
		s.def = newDeferrer(opts.Defer, opts.DeferLimits, h)
		s.def.publish = s.publishDeferred
		h.def = s.def
		s.releaser = srv.NewClient(nil, releaseListener, "", true)
	}
	return s, nil
}

// publishDeferred publishes a released message as its device: through
// an inline client named after it, so subscribers see the device as the
// origin (No Local applies) and the throttle passes it uncounted; the
// release round counted it. One client serves every device: mochi's
// clients carry a large outbound buffer, too costly to make per release,
// and a release round is the only user.
func (s *Server) publishDeferred(device string, m *deferredMsg, expiry uint32) error {
	if s.hook.consumers.acquire() {
		defer s.hook.consumers.done()
	}
	cl := s.releaser
	cl.ID = device
	cl.Properties.ProtocolVersion = m.Version
	if err := s.mqtt.InjectPacket(cl, m.packet(expiry)); err != nil {
		return fmt.Errorf("publish deferred message on %q: %w", m.Topic, err)
	}
	return nil
}

// Publish publishes a command from upstream (forward's subscribe:) to
// the local subscribers, as the server itself (an inline client). It is
// counted against no quota and not forwarded upstream again. It waits
// at the consumers' gate like a device's publish (consumers.go).
//
// When it returns nil, every session the command reached that is kept
// (a client away, or connected, that keeps its session) holds it
// durably when Options.Sessions is set (keptsessions.go), until the client
// acknowledges it; a clean session got it on its connection. An error
// wrapping ErrCommandNotKept means a kept session could not store it:
// the caller should not acknowledge it upstream.
func (s *Server) Publish(topic string, payload []byte, retain bool, qos byte) error {
	if s.hook.consumers.acquire() {
		defer s.hook.consumers.done()
	}
	s.sessions.cmdMu.Lock() // one command at a time (sessions.failed is the one in progress's), none during a takeover
	defer s.sessions.cmdMu.Unlock()
	s.sessions.takeFailed()
	err := s.mqtt.InjectPacket(s.commander, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos, Retain: retain},
		TopicName: topic, Payload: payload, PacketID: uint16(qos)}) // a packet ID for mochi's checks, as its own Publish
	if err != nil {
		return fmt.Errorf("publish command on %q: %w", topic, err)
	}
	if err := s.sessions.takeFailed(); err != nil {
		return fmt.Errorf("%w: %v", ErrCommandNotKept, err)
	}
	return nil
}

// releaseTick runs one release round at now; see deferrer.releaseTick.
func (s *Server) releaseTick(now devicelimit.Tick) {
	if s.def != nil {
		s.def.releaseTick(now)
	}
}

// Start restores the deferral queue from Options.Defer, then binds
// TCPAddr and serves MQTT on it; it returns once the listener is bound.
// Restored messages are released in order, as their devices' windows
// admit them, with sequence numbers continuing after the highest stored.
// After a failed Start nothing is left running; Close is still safe.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closing:
		return ErrClosed
	case s.started:
		return ErrStarted
	}
	if err := s.hook.blocks.load(s.opts.Clock.Now()); err != nil {
		return err
	}
	if s.def != nil && !s.def.loaded {
		msgs, devices, err := s.def.load(s.opts.Clock.Now())
		if err != nil {
			return err // "restore deferred messages: ...", naming the file, device and seq
		}
		if msgs > 0 {
			s.logger().Info("deferred messages restored", "messages", msgs, "devices", devices)
		}
	}
	if err := s.sessions.load(); err != nil {
		return err
	}
	if n, m := s.sessions.restored(); n > 0 {
		s.logger().Info("kept sessions restored", "sessions", n, "commands", m)
	}
	if err := s.startListeners(); err != nil {
		return err
	}
	s.startSweep()
	if s.def != nil {
		s.startDeferral()
	}
	s.started = true
	return nil
}

// startDeferral starts the release loop and the deleter.
func (s *Server) startDeferral() {
	s.releaseStop, s.releaseDone = make(chan struct{}), make(chan struct{})
	s.deleteStop, s.deleteDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(s.releaseDone)
		if !s.noReleaseLoop {
			s.def.run(s.releaseStop)
		}
	}()
	go func() {
		defer close(s.deleteDone)
		s.def.runDeletes(s.deleteStop)
	}()
}

func (s *Server) logger() *slog.Logger {
	if s.opts.Logger == nil {
		return discardLogger
	}
	return s.opts.Logger
}

// startSweep starts the loop that calls tick every SweepInterval.
func (s *Server) startSweep() {
	s.stop = make(chan struct{})
	s.loopDone = make(chan struct{})
	go func() {
		defer close(s.loopDone)
		t := time.NewTicker(s.opts.SweepInterval)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				s.tick(s.opts.Clock.Now())
			}
		}
	}()
}

// tick does the periodic housekeeping at now.
func (s *Server) tick(now devicelimit.Tick) {
	s.hook.blocks.expire(now)
	s.hook.sweep(now)
	s.auth.sweep(now)
	s.takeover.sweep()
}

// disconnectClients ends every client of the listener on shutdown. MQTT 5
// clients get DISCONNECT 0x8B first; 3.1.1 has no server DISCONNECT
// (mochi's DisconnectClient would write one; the throttle's encode keeps
// it off the wire, feedback.go).
func (s *Server) disconnectClients(listener string) {
	for _, cl := range s.mqtt.Clients.GetAll() {
		if cl.Net.Listener != listener || cl.Closed() {
			continue
		}
		if cl.Properties.ProtocolVersion == 5 {
			_ = s.mqtt.DisconnectClient(cl, packets.ErrServerShuttingDown) // writes DISCONNECT, stops the client
		} else {
			cl.Stop(packets.ErrServerShuttingDown)
		}
	}
}

// Addr returns the bound TCP address, or nil before a successful Start.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tcp == nil {
		return nil
	}
	return s.tcp.Addr()
}

// Stats returns the throttle's decision counters, the deferral queue's
// counters and size, and the number of connected clients.
func (s *Server) Stats() Stats {
	st := s.hook.stats()
	st.Subscriptions = atomic.LoadInt64(&s.mqtt.Info.Subscriptions)
	st.SlowSubscriberDrops = s.mlog.inflightDrops.Load()
	return st
}

// DeviceStatus returns what the broker knows of device now: its live
// connection, its last publish and its deferred messages. A device the
// broker knows nothing of gets the zero DeviceStatus.
func (s *Server) DeviceStatus(device string) DeviceStatus {
	st := s.hook.status(device)
	if s.def != nil {
		st.Deferred = s.def.queueLen(device)
	}
	st.BlockedUntil, _ = s.hook.blocks.until(device, s.opts.Clock.Now())
	return st
}

// Blocks returns the devices blocked now (automatic blocking), by ID.
func (s *Server) Blocks() []Blocked { return s.hook.blocks.list(s.opts.Clock.Now()) }

// Block returns device's block in force now, with its start and reason
// when this gateway made it (or restored it from its data file).
func (s *Server) Block(device string) (Blocked, bool) {
	return s.hook.blocks.get(device, s.opts.Clock.Now())
}

// Unblock lifts device's block and reports whether it had one in
// force; its CONNECTs are accepted again at once. Lifting a block also
// forgets the refusals counted toward it: the device is blocked again
// only after Block.After new ones.
func (s *Server) Unblock(device string) (bool, error) {
	had, err := s.hook.blocks.lift(device, s.opts.Clock.Now())
	if had {
		err = errors.Join(err, s.hook.forgetRefusals(device))
	}
	return had, err
}

// Close stops releasing deferred messages, stops accepting connections,
// disconnects every client (MQTT 5 clients get DISCONNECT 0x8B server
// shutting down), deletes the messages released so far from the
// DeferStore and stops the server's goroutines. Messages still queued
// stay in the store for the next Start. It returns when all of that is
// done, or with ctx's error when ctx ends first (shutdown then continues
// in the background; keep the DeferStore open until it ends). Close is
// safe after a failed Start and more than once; a second call waits for
// the first.
func (s *Server) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closing = true
		started := s.started
		s.mu.Unlock()
		go func() {
			defer close(s.closed)
			if !started {
				return
			}
			if s.def != nil {
				// Stop releasing first: a message released into a server
				// that is disconnecting its clients would be lost, and
				// then deleted.
				close(s.releaseStop)
				<-s.releaseDone
			}
			s.drain()
			_ = s.mqtt.Close() // always nil in mochi v2.7.9; publishes in flight end first
			close(s.stop)
			<-s.loopDone
			if s.def != nil {
				close(s.deleteStop) // deletes what was released
				<-s.deleteDone
			}
		}()
	})
	select {
	case <-s.closed:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close broker: %w", ctx.Err())
	}
}
