package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/devicegate/devicegate/admin"
	"github.com/devicegate/devicegate/admin/console"
	"github.com/devicegate/devicegate/broker"
	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/forward"
	"github.com/devicegate/devicegate/internal/topk"
	"github.com/devicegate/devicegate/persist"
)

// ShutdownTimeout bounds a graceful shutdown, from the signal to exit.
const ShutdownTimeout = 5 * time.Second

// lockTimeout is how long start-up waits for another gateway to let go
// of the data directory before giving up.
const lockTimeout = time.Second

// throttledK and throttledPeriod size the summary behind GET
// /api/v1/throttled: the 100 devices refused most, counted over the last
// one to two minutes (topk.Generations periods of one).
const (
	throttledK      = 100
	throttledPeriod = time.Minute
)

// snapshotReserve is the part of a shutdown's time kept for the final
// snapshot and closing the store, however long stopping MQTT takes.
const snapshotReserve = 1500 * time.Millisecond

// Deps are what Start takes from outside the configuration, so that
// tests (and the simulator's clock steps) can inject their own.
type Deps struct {
	// Time is where the logical clock reads the wall and monotonic
	// clocks; nil means devicelimit.RealTime.
	Time devicelimit.TimeSource
	// Logger receives every log line; nil discards them.
	Logger *slog.Logger
	// Level is Logger's level, which a reload sets to log.level; nil:
	// a reload leaves the level as it is.
	Level *slog.LevelVar
	// Version is logged at start by Run.
	Version string
	// Load reads the configuration again for a reload (SIGHUP, POST
	// /api/v1/reload): the file and the flags; nil: no reload.
	Load func() (config.Config, error)
}

// Gateway is a running gateway: its state store, clock, snapshotter,
// MQTT server and admin server. Build it with Start; Close stops it.
type Gateway struct {
	log      *slog.Logger
	store    *persist.Store
	clock    *devicelimit.SystemClock
	table    *devicelimit.Table
	resolver *devicelimit.Resolver
	snap     *persist.Snapshotter
	leaser   *persist.Leaser // nil without leases
	srv      *broker.Server
	topk     *topk.Tracker
	admin    *admin.Server
	cluster  *clusterParts // nil unless cluster.redis is configured
	forward  *forward.Set  // nil without forward: upstreams
	// forwardConns are the forwarders of each forward: entry (reload.go).
	forwardConns [][]forwardConn

	// started is set once Start has succeeded; prevUnclean when
	// the previous run had not shut down cleanly. Close keeps the file
	// marked unclean when this run's admissions may be missing from it
	// or when a failed start would otherwise hide the previous crash.
	started     bool
	prevUnclean bool

	closeOnce sync.Once
	closeErr  error

	// The reload's (reload.go): the configuration in force, how to read
	// it again, the log level and the TLS certificate it sets.
	reloadMu sync.Mutex
	cfg      config.Config
	load     func() (config.Config, error)
	level    interface{ Set(slog.Level) }
	cert     interface{ Store(*tls.Certificate) }
	limits   broker.Limits // the broker's, as in force
	reloads  *prometheus.CounterVec
}

// Start opens the data directory, restores the device windows and
// quota overrides, and starts the snapshotter and the MQTT server, in
// that order: the listener accepts connections only once the state is
// restored; then the admin API (and /metrics). It returns once both
// listen. On failure it closes what
// it opened, in reverse, and returns an error a person can act on. cfg
// must have passed Validate.
func Start(cfg config.Config, d Deps) (_ *Gateway, err error) {
	src := d.Time
	if src == nil {
		src = devicelimit.RealTime
	}
	log := d.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Validate has checked every value these builders read.
	table, err := cfg.Table()
	if err != nil {
		return nil, err
	}
	resolver, err := cfg.Resolver()
	if err != nil {
		return nil, err
	}
	identity, err := cfg.Identity()
	if err != nil {
		return nil, err
	}
	sec, err := loadSecurity(cfg)
	if err != nil {
		return nil, err
	}

	g := &Gateway{log: log, table: table, resolver: resolver, cfg: cfg, load: d.Load, reloads: newReloadCounter()}
	if d.Level != nil {
		g.level = d.Level
	}
	if sec.cert != nil {
		g.cert = sec.cert
	}
	g.limits = sec.limits
	if usesRedis(cfg) {
		routeRedisLog(log)
	}
	defer func() {
		if err != nil {
			ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
			defer cancel()
			if cerr := g.Close(ctx); cerr != nil {
				err = errors.Join(err, cerr)
			}
		}
	}()

	check, err := persist.ParseCheckMode(cfg.Persist.CheckOnStart)
	if err != nil {
		return nil, fmt.Errorf("persist.check_on_start: %w", err)
	}
	store, err := persist.Open(cfg.DataDir, persist.Options{LockTimeout: lockTimeout, Logger: log, Check: check,
		MinFreeBytes: int64(cfg.Persist.MinFreeBytes)})
	if err != nil {
		return nil, storeError(cfg.DataDir, err)
	}
	g.store = store
	meta := store.Meta()
	g.prevUnclean = !meta.New && !meta.CleanShutdown
	checked := "skipped"
	if meta.Checked > 0 {
		checked = meta.Checked.String()
	}
	log.Info("state opened", "path", store.Path(), "new", meta.New, "schema", meta.Schema, "check", checked)

	// The clock starts at max(wall clock, high-water): a wall clock set
	// back while the gateway was down cannot empty a window.
	g.clock = devicelimit.NewSystemClockOn(src, meta.HighWater)
	if g.clock.RolledBack {
		log.Warn("wall clock is behind the persisted clock; continuing from the high-water, windows keep counting",
			"wall", g.clock.Wall.String(), "high_water", meta.HighWater.String(), "behind", meta.HighWater.Sub(g.clock.Wall).String())
	}
	interval := time.Duration(cfg.Persist.SnapshotInterval)
	// After a crash, what was admitted since the last snapshot is lost,
	// made at the latest by the persisted high-water (written every
	// interval) plus one interval and the time the next snapshot took
	// (taken as at most another), and before this restart. With leases,
	// each window is charged what its open lease could have admitted
	// beyond its last snapshot or lease write, at the earlier of the two
	// (devicelimit/crashcharge.go).
	charge := g.prevUnclean && table.Leases()
	at := min(meta.HighWater.Add(2*interval), g.clock.Now())
	if g.prevUnclean && !charge {
		log.Warn("the previous run did not shut down cleanly; up to one snapshot interval of admissions may have been lost, so devices may get that many extra messages in their current window (persist.after_crash: forgive)",
			"path", store.Path())
	}

	begin := time.Now()
	windows, err := store.RestoreWindows(table)
	if err != nil {
		return nil, storeError(cfg.DataDir, fmt.Errorf("restore windows: %w", err))
	}
	overrides, err := store.RestoreOverrides(resolver, g.clock.Now())
	if err != nil {
		return nil, storeError(cfg.DataDir, fmt.Errorf("restore quota overrides: %w", err))
	}
	charged, err := store.SettleLeases(table, charge, at, g.clock.Now())
	if err != nil {
		return nil, storeError(cfg.DataDir, err)
	}
	if charge {
		log.Warn("the previous run did not shut down cleanly; each window with an open lease is charged what that lease could have admitted beyond its last snapshot or lease write, as of the restart; the others are charged nothing",
			"path", store.Path(), "charged_windows", charged, "charged_at", at.String(), "lease", table.LeasePolicy())
	}
	log.Info("state restored", "windows", windows, "overrides", overrides, "took", time.Since(begin).String())
	if err := store.MarkRunning(g.clock.Now()); err != nil {
		return nil, storeError(cfg.DataDir, err)
	}

	g.snap = persist.NewSnapshotter(store, table, g.clock, interval, log)
	g.snap.Start()
	if table.Leases() {
		g.leaser = persist.NewLeaser(store, table, log)
	}

	if err := g.startCluster(cfg); err != nil {
		return nil, err
	}
	// Commands from upstream are published once the broker runs: the
	// forwarders start after it.
	if g.forward, g.forwardConns, err = newForward(cfg, store, log, src.Wall, func(topic string, payload []byte, retain bool, qos byte) error {
		err := g.srv.Publish(topic, payload, retain, qos)
		if err != nil && !errors.Is(err, broker.ErrCommandNotKept) {
			// Published nowhere, and would not be on a second try.
			log.Error("command from upstream not delivered", "topic", topic, "error", err)
			return nil
		}
		return err // not kept: not acknowledged, sent again
	}); err != nil {
		return nil, err
	}
	g.topk = topk.New(throttledK, throttledPeriod)
	srv, err := broker.New(broker.Options{
		Throttled: g.topk,
		Forward:   g.forwarder(),
		Limiter:   g.brokerLimiter(),
		TCPAddr:   cfg.MQTT.TCP,
		Table:     table,
		Resolver:  resolver,
		Clock:     g.clock,
		Identity:  identity,
		Logger:    log,
		Defer:     store,
		Blocks:    g.blockStore(store),
		Sessions:  store,
		DeferLimits: broker.DeferLimits{
			MaxMessagesPerDevice: cfg.Limits.Defer.MaxMessagesPerDevice,
			MaxBytesPerDevice:    int64(cfg.Limits.Defer.MaxBytesPerDevice),
			MaxTotalBytes:        int64(cfg.Limits.Defer.MaxTotalBytes),
			MaxAge:               time.Duration(cfg.Limits.Defer.MaxAge),
			RestoreDelay:         time.Duration(cfg.Limits.Defer.RestoreDelay),
		},
		TLSAddr:       cfg.MQTT.TLS.Addr,
		TLS:           sec.tls,
		WebSocketAddr: cfg.MQTT.WebSocket.Addr,
		WebSocketTLS:  cfg.MQTT.WebSocket.TLS,
		Auth:          sec.auth,
		Limits:        sec.limits,
		GroupJoined:   g.groupJoined(),
	})
	if err != nil {
		return nil, err
	}
	g.srv = srv
	g.clusterBroker(srv)
	if err := srv.Start(); err != nil {
		var le *broker.ListenError
		if errors.As(err, &le) {
			// Name the setting that gave the address.
			return nil, fmt.Errorf("%s: %w", listenerKeys[le.Listener], err)
		}
		return nil, err
	}
	if g.forward != nil {
		g.forward.Start()
	}

	token, path, created, err := admin.LoadOrCreateToken(cfg.Admin.Token, cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("admin token: %w", err)
	}
	switch {
	case path != "":
		log.Info("admin token", "path", path, "created", created)
	case cfg.Admin.Token != "":
		log.Info("admin token", "source", "admin.token")
	default:
		log.Info("admin token", "source", admin.TokenEnv)
	}
	reg := prometheus.NewRegistry()
	var rollbacks uint64
	if g.clock.RolledBack {
		rollbacks = 1
	}
	stats := statsSource{forward: g.forward, store: store, srv: srv, table: table, snap: g.snap, leaser: g.leaser, rollbacks: rollbacks}
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		admin.NewCollector(stats),
	)
	var ui http.Handler
	if cfg.Admin.Console {
		ui = console.Handler()
	}
	g.registerClusterMetrics(reg)
	reg.MustRegister(g.reloads)
	g.admin, err = admin.New(admin.Options{
		Addr:      cfg.Admin.Addr,
		Token:     token,
		Table:     table,
		Resolver:  resolver,
		Identity:  identity,
		Clock:     g.clock,
		Overrides: g.adminOverrides(),
		Windows:   g.adminWindows(),
		Devices:   brokerDevices{srv},
		Blocks:    brokerBlocks{srv, g.snap},
		Groups:    g.adminGroups(),
		Throttled: topThrottled{g.topk, g.clock},
		Listing:   trackedDevices{srv, table},
		Stats:     stats,
		Console:   ui,
		Registry:  reg,
		Logger:    log,
		Health:    g.health,
		Forward: func() []admin.ForwardStats {
			return forwardStats(g.forward)
		},
		Dead:     deadLetters{g.forward},
		NoDefer:  noDefer(cfg),
		Backup:   g.snap.Backup,
		Reload:   g.adminReload,
		Deferred: brokerDevices{srv}.Deferred,
		Next:     brokerDevices{srv}.Next,
		History:  brokerDevices{srv}.History,

		TLSCertFile: cfg.Admin.TLS.CertFile,
		TLSKeyFile:  cfg.Admin.TLS.KeyFile,
	})
	if err != nil {
		return nil, err
	}
	if err := g.admin.Start(); err != nil {
		key := "admin.tls"
		if oe := (*net.OpError)(nil); errors.As(err, &oe) && oe.Op == "listen" {
			key = "admin.addr"
		}
		return nil, fmt.Errorf("%s: admin api: %w", key, err)
	}
	logSecurity(log, cfg, sec)
	g.started = true
	return g, nil
}

// Run is `gateway serve`: it starts a gateway, logs what it serves,
// reloads the configuration on SIGHUP (reload.go), and when ctx ends shuts the
// gateway down within ShutdownTimeout.
func Run(ctx context.Context, cfg config.Config, d Deps) error {
	g, err := Start(cfg, d)
	if err != nil {
		return err
	}
	log, def := g.log, cfg.Limits.Default
	log.Info("gateway started", "version", d.Version, "go", runtime.Version())
	g.LogListeners()
	g.reloadOnHangup(ctx)
	log.Info("admin listening", "addr", g.AdminAddr().String())
	if len(def.Windows) > 0 {
		log.Info("default quota", "windows", def.Quota().Describe(), "policy", def.Policy,
			"buckets", cfg.Limits.Buckets, "identity", cfg.Limits.Identity, "rules", len(cfg.Limits.Rules))
	} else {
		log.Info("default quota", "limit", def.Limit, "window", def.Window.String(), "policy", def.Policy,
			"buckets", cfg.Limits.Buckets, "identity", cfg.Limits.Identity, "rules", len(cfg.Limits.Rules))
	}

	// Listening, state restored: tell systemd (Type=notify).
	if err := sdNotify("READY=1\nSTATUS=serving\nMAINPID=" + strconv.Itoa(os.Getpid())); err != nil {
		log.Warn("readiness not sent to the service manager", "NOTIFY_SOCKET", os.Getenv("NOTIFY_SOCKET"), "error", err)
	}

	<-ctx.Done()
	_ = sdNotify("STOPPING=1")
	log.Info("shutting down", "timeout", ShutdownTimeout.String())
	begin := time.Now()
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := g.Close(sctx); err != nil {
		return err
	}
	log.Info("stopped", "took", time.Since(begin).Round(time.Millisecond).String())
	return nil
}

// SetOverride sets device's quota override by the admin API's path: in
// Redis when the gateway shares its state there (so every gateway
// sharing it judges the device by it), else in the data file. The
// embedded simulator's quota mix comes this way.
func (g *Gateway) SetOverride(device string, o devicelimit.Override) error {
	return g.adminOverrides().SetOverride(device, o)
}

// Addr returns the MQTT listener's address.
func (g *Gateway) Addr() net.Addr { return g.srv.Addr() }

// AdminAddr returns the admin API's address.
func (g *Gateway) AdminAddr() net.Addr { return g.admin.Addr() }

// Close shuts the gateway down in order: stop accepting MQTT (and end
// every connection), stop the admin API (finishing the requests in
// flight), write the final snapshot and mark the shutdown clean, close
// the store. The admin API stops before the snapshot,
// not after the store closes as it does elsewhere, because its requests
// change state: an override set or a window reset after the final
// snapshot would be lost, or fail on a closed store. Stopping MQTT and
// the admin API may use all of ctx's time but snapshotReserve, so that
// a broker slow to stop still leaves time for the final snapshot. Close is safe after a failed
// start and more than once; later calls return the first one's result.
func (g *Gateway) Close(ctx context.Context) error {
	g.closeOnce.Do(func() { g.closeErr = g.close(ctx) })
	return g.closeErr
}

func (g *Gateway) close(ctx context.Context) error {
	var errs []error
	if g.srv != nil {
		bctx, cancel := beforeSnapshot(ctx)
		defer cancel()
		if err := within(bctx, g.srv.Close); err != nil {
			// Publishes may still be decided after the final snapshot;
			// those are lost as in a crash. Say so, and carry on: the
			// snapshot matters more.
			errs = append(errs, fmt.Errorf("stop mqtt: %w", err))
		}
	}
	if g.admin != nil {
		actx, cancel := beforeSnapshot(ctx)
		defer cancel()
		if err := within(actx, g.admin.Close); err != nil {
			errs = append(errs, fmt.Errorf("stop admin api: %w", err))
		}
	}
	if g.forward != nil {
		// What was not sent stays in the forward logs. A destination
		// that stopped answering must not cost the final snapshot its
		// time.
		fctx, cancel := beforeSnapshot(ctx)
		defer cancel()
		if err := g.forward.Stop(fctx); err != nil {
			g.log.Warn("forwarding not stopped in time; what it had not sent stays in the forward logs", "error", err)
		}
	}
	stopFailed := len(errs) > 0 // MQTT or admin may still have changed state
	if err := within(ctx, g.closeCluster); err != nil {
		errs = append(errs, err)
	}
	if g.leaser != nil {
		// No admission waits for a lease once MQTT has stopped; the
		// final snapshot records every window whole.
		if err := g.leaser.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if g.snap != nil {
		if err := within(ctx, g.snap.Close); err != nil {
			errs = append(errs, fmt.Errorf("final snapshot: %w", err))
		}
		// The final snapshot marks the file clean. Not so when this run
		// may have admitted after it, or when a failed start would hide
		// that the previous run crashed: the next start must warn.
		if stopFailed || (!g.started && g.prevUnclean) {
			if err := g.store.MarkRunning(g.clock.Now()); err != nil {
				errs = append(errs, fmt.Errorf("keep the unclean-shutdown mark: %w", err))
			}
		}
	}
	if g.store != nil {
		if err := within(ctx, func(context.Context) error { return g.store.Close() }); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", g.store.Path(), err))
		}
	}
	return errors.Join(errs...)
}

// beforeSnapshot is ctx less snapshotReserve: the time a step of Close
// may take and still leave the final snapshot its own.
func beforeSnapshot(ctx context.Context) (context.Context, context.CancelFunc) {
	if deadline, ok := ctx.Deadline(); ok {
		return context.WithDeadline(ctx, deadline.Add(-snapshotReserve))
	}
	return ctx, func() {}
}

// within runs fn, giving up at ctx's deadline even if fn does not: the
// process must exit on time.
func within(ctx context.Context, fn func(context.Context) error) error {
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("not done in time: %w", ctx.Err())
	}
}

// storeError turns an error from the state store into a message a person
// can act on: a directory in use by another gateway, or a data file that
// cannot be read, named with what to do about it.
// listenerKeys name the setting of each MQTT listener's address.
var listenerKeys = map[string]string{"tcp": "mqtt.tcp", "tls": "mqtt.tls.addr", "ws": "mqtt.websocket.addr"}

func storeError(dir string, err error) error {
	file := filepath.Join(dir, persist.FileName)
	switch {
	case errors.Is(err, persist.ErrInUse):
		// persist names the lock file; the operator acts on the directory.
		return &actionError{fmt.Sprintf("data directory %q is in use by another gateway (no lock within %s); stop it, or give this one its own --data-dir", dir, lockTimeout), err}
	case errors.Is(err, persist.ErrCorrupt):
		return &actionError{fmt.Sprintf("%s; the file was left as it is: restore it from a backup, or move it away to start with empty state (every device then gets a fresh quota)", nameFile(file, err)), err}
	case errors.Is(err, persist.ErrNewerSchema):
		return &actionError{fmt.Sprintf("%s; it was written by a newer devicegate: run that version, or move the file away to start with empty state", nameFile(file, err)), err}
	}
	// Otherwise (permissions, not a directory...) the setting that
	// named the directory leads.
	if strings.Contains(err.Error(), strconv.Quote(dir)) {
		return fmt.Errorf("data_dir: %w", err) // names the directory, which is what is wrong
	}
	return &actionError{"data_dir: " + nameFile(file, err), err}
}

// nameFile returns err's message, led by the file's name unless it
// already names it.
func nameFile(file string, err error) string {
	if strings.Contains(err.Error(), file) {
		return err.Error()
	}
	return fmt.Sprintf("data file %s: %v", file, err)
}

// actionError is an error with a message for people in front of the
// error it explains, which errors.Is and errors.As still find.
type actionError struct {
	msg string
	err error
}

func (e *actionError) Error() string { return e.msg }
func (e *actionError) Unwrap() error { return e.err }
