package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/admin"
	"github.com/devicegate/devicegate/broker"
	"github.com/devicegate/devicegate/cluster"
	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/persist"
)

// RedisPasswordEnv is where the Redis password comes from when
// cluster.redis.password is empty.
const RedisPasswordEnv = "GATEWAY_REDIS_PASSWORD"

// overrideSyncWait bounds how long start-up waits for the first read
// of the shared overrides before it serves anyway (they apply as soon
// as Redis answers).
const overrideSyncWait = 5 * time.Second

// clusterParts are a gateway's shared-state parts, when cluster.redis is
// configured: the Redis clients, the limiter deciding on the shared
// windows and the mirror of the shared overrides.
type clusterParts struct {
	decisions, control redis.UniversalClient
	limiter            *cluster.Limiter
	// owner decides where the device is (cluster.decisions: owner); nil
	// when every decision is a script call in Redis.
	owner     *cluster.Owner
	broker    atomic.Pointer[broker.Server] // for the owner's session takeovers
	overrides *cluster.Overrides
	blocks    *cluster.Blocks
	groups    *cluster.GroupRegistry
	settings  *cluster.Settings // agreed with the other gateways
}

// settingsWait bounds how long start-up waits for Redis to compare this
// gateway's cluster settings with the others' (cluster.Agree).
const settingsWait = 2 * time.Second

// startCluster connects the gateway to Redis when cfg asks for it; the
// gateway runs alone otherwise. It needs the table, resolver and clock.
func (g *Gateway) startCluster(cfg config.Config) error {
	if !cfg.Cluster.Enabled() {
		return nil
	}
	policy, err := cluster.ParsePolicy(cfg.Cluster.FailurePolicy) // Validate has checked it
	if err != nil {
		return fmt.Errorf("cluster.failure_policy: %w", err)
	}
	r := cfg.Cluster.Redis
	password := r.Password
	if password == "" {
		password = os.Getenv(RedisPasswordEnv)
	}
	timeout := time.Duration(r.Timeout)
	c := &clusterParts{}
	c.decisions, c.control = cluster.NewClients(cluster.Config{
		Addrs: r.Addrs, Username: r.Username, Password: password, TLS: r.TLS, DB: r.DB, Timeout: timeout,
	})
	g.cluster = c
	log := g.log.With("component", "cluster")
	if c.settings, err = cluster.Agree(c.control, cluster.DefaultPrefix, cfg.Cluster.Decisions, settingsWait, log); err != nil {
		return err
	}
	c.limiter, err = cluster.New(cluster.Options{Client: c.decisions, Local: g.table, Timeout: timeout, Policy: policy, Logger: log})
	if err != nil {
		return err
	}
	if cfg.Cluster.Decisions == "owner" {
		c.owner, err = cluster.NewOwner(cluster.OwnerOptions{
			Client: c.decisions, Control: c.control, Shared: c.limiter, Clock: g.clock, Logger: log,
			LeaseShare: cfg.Cluster.LeaseShare, GatewayTTL: time.Duration(cfg.Cluster.GatewayTTL),
			OnLost: func(device string) {
				if srv := c.broker.Load(); srv != nil {
					if n := srv.CloseDevice(device); n > 0 {
						log.Info("device taken over by another gateway; its session here closed", "device", device, "connections", n)
					}
				}
			},
		})
		if err != nil {
			return fmt.Errorf("cluster.decisions: %w", err)
		}
		log.Info("deciding publishes where each device is connected", "gateway", c.owner.ID(),
			"lease_share", cfg.Cluster.LeaseShare, "gateway_ttl", time.Duration(cfg.Cluster.GatewayTTL).String())
	}
	c.overrides = cluster.NewOverrides(c.control, g.resolver, g.clock, cluster.DefaultPrefix, log)
	c.blocks = cluster.NewBlocks(c.control, cluster.DefaultPrefix, timeout)
	c.groups = cluster.NewGroupRegistry(c.control, cluster.DefaultPrefix, g.table.Buckets(), log)
	c.overrides.Start()
	select {
	case <-c.overrides.Synced():
	case <-time.After(overrideSyncWait):
		log.Warn("quota overrides not yet read from redis; serving with the local ones until it answers", "waited", overrideSyncWait.String())
	}
	log.Info("sharing device windows and quota overrides in redis", "addrs", r.Addrs, "db", r.DB, "tls", r.TLS,
		"timeout", timeout.String(), "failure_policy", policy.String())
	return nil
}

// brokerLimiter returns the limiter of the publish decisions: the shared
// one, or nil for the broker's own table.
func (g *Gateway) brokerLimiter() broker.Limiter {
	if g.cluster == nil {
		return nil
	}
	if g.cluster.owner != nil {
		return g.cluster.owner
	}
	return g.cluster.limiter
}

// clusterBroker tells the owner the broker whose sessions it closes
// when another gateway takes a device over.
func (g *Gateway) clusterBroker(srv *broker.Server) {
	if g.cluster != nil {
		g.cluster.broker.Store(srv)
	}
}

// groupJoined returns where the broker tells of the groups its devices
// join: the shared registry, or nil alone.
func (g *Gateway) groupJoined() func(devicelimit.Membership) {
	if g.cluster == nil {
		return nil
	}
	return g.cluster.groups.Record
}

// adminGroups returns the groups the admin API lists: the broker's,
// and in a cluster those the other gateways' devices joined too.
func (g *Gateway) adminGroups() admin.Groups {
	local := brokerGroups{g.srv}
	if g.cluster == nil {
		return local
	}
	return sharedGroups{local, g.cluster.groups, g.log}
}

// sharedGroups lists this gateway's groups and then the registry's it
// has not seen (none of their devices connected here). Redis not
// answering in time leaves the registry's out, logged.
type sharedGroups struct {
	local brokerGroups
	reg   *cluster.GroupRegistry
	log   *slog.Logger
}

func (s sharedGroups) Groups() []admin.GroupMembers {
	out := s.local.Groups()
	ctx, cancel := context.WithTimeout(context.Background(), sharedGroupsWait)
	defer cancel()
	shared, err := s.reg.List(ctx)
	if err != nil {
		s.log.Warn("groups of the other gateways not listed", "component", "cluster", "err", err.Error())
		return out
	}
	for _, m := range shared {
		if !slices.ContainsFunc(out, func(x admin.GroupMembers) bool { return x.Name == m.Name }) {
			out = append(out, admin.GroupMembers{Name: m.Name, Label: m.Label, Quota: m.Quota})
		}
	}
	return out
}

// sharedGroupsWait bounds the admin API's read of the shared groups.
const sharedGroupsWait = 2 * time.Second

// adminOverrides returns where the admin API changes overrides: Redis
// when shared, else the state file.
func (g *Gateway) adminOverrides() admin.Overrides {
	if g.cluster == nil {
		return persist.BoundOverrides{Store: g.store, Resolver: g.resolver}
	}
	return g.cluster.overrides
}

// registerClusterMetrics adds the shared-window metrics to reg.
func (g *Gateway) registerClusterMetrics(reg *prometheus.Registry) {
	if g.cluster != nil {
		reg.MustRegister(admin.NewClusterCollector(clusterStats{g.cluster.limiter, g.cluster.owner}))
	}
}

type clusterStats struct {
	l     *cluster.Limiter
	owner *cluster.Owner // nil unless decisions are where the device is
}

func (s clusterStats) ClusterStats() admin.ClusterStats {
	st := s.l.Stats()
	out := admin.ClusterStats{Policy: st.Policy.String(), Fallbacks: st.Fallbacks, Up: st.Up}
	if s.owner != nil {
		o := s.owner.Stats()
		out.Owner = &admin.OwnerStats{Claims: o.Claims, ClaimWaits: o.ClaimWaits, Charges: o.Charges, Checkpoints: o.Checkpoints,
			Fenced: o.Fenced, Releases: o.Releases, Fallbacks: o.Fallbacks, Owned: o.Owned,
			GrantClaims: o.GrantClaims, GrantRefused: o.GrantRefused, GrantFailed: o.GrantFailed,
			GrantUnits: o.GrantUnits, GrantReturned: o.GrantReturned, Grants: o.Grants}
	}
	return out
}

// closeCluster stops the shared-state parts; call it once MQTT and the
// admin API have stopped.
func (g *Gateway) closeCluster(context.Context) error {
	c := g.cluster
	if c == nil {
		return nil
	}
	var errs []error
	if c.owner != nil {
		c.owner.Close() // releases its devices: their next gateway charges nothing
	}
	if c.limiter != nil {
		c.limiter.Close()
	}
	if c.overrides != nil {
		errs = append(errs, c.overrides.Close())
	}
	if c.groups != nil {
		c.groups.Close()
	}
	if c.settings != nil {
		c.settings.Close()
	}
	errs = append(errs, c.decisions.Close(), c.control.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close redis clients: %w", err)
	}
	return nil
}

// adminWindows returns the windows the admin API reads and resets: nil
// (the table) unless they are shared.
func (g *Gateway) adminWindows() admin.Windows {
	local := localWindows{g.table, g.snap}
	if g.cluster == nil {
		return local
	}
	return sharedWindows{g.cluster.limiter, g.cluster.owner, local, g.resolver}
}

// localWindows are this gateway's table, as the admin API sees them: a
// reset is in the data file before it is answered (persist.Snapshotter.Reset).
type localWindows struct {
	t    *devicelimit.Table
	snap *persist.Snapshotter
}

func (w localWindows) PeekAllAt(device, class string, ls []devicelimit.Limit, size int, now devicelimit.Tick) (devicelimit.Verdict, error) {
	return w.t.PeekAllAt(device, class, ls, size, now), nil
}

// Reset empties the device's windows and writes that to the data file;
// an error wraps admin.ErrResetNotDurable: the windows are empty in
// memory, and the next snapshot writes them; or, once the gateway is
// stopping (its final snapshot taken), nothing changed.
func (w localWindows) Reset(device string) (bool, error) {
	had, err := w.snap.Reset(device)
	if errors.Is(err, persist.ErrClosed) {
		return false, err
	}
	if err != nil {
		return had, fmt.Errorf("%w: %w", admin.ErrResetNotDurable, err)
	}
	return had, nil
}

// sharedWindows are the windows in Redis, as the admin API sees them.
type sharedWindows struct {
	l        *cluster.Limiter
	owner    *cluster.Owner // nil unless decisions are where the device is
	local    localWindows
	resolver *devicelimit.Resolver
}

// PeekAllAt reads the shared windows; an error when Redis does not
// answer (not the failure policy's answer: a look is not a decision).
func (w sharedWindows) PeekAllAt(device, class string, ls []devicelimit.Limit, size int, now devicelimit.Tick) (devicelimit.Verdict, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if w.owner != nil {
		return w.owner.PeekAll(ctx, device, class, ls, size, now)
	}
	return w.l.PeekAll(ctx, device, class, ls, size)
}

// Reset empties the shared window, the owner's (cluster.Owner.Reset:
// in the device's checkpoint in Redis before it returns, the device
// taken over from the gateway that owns it), and this gateway's own,
// which the failure policy local decides on.
func (w sharedWindows) Reset(device string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	classes := w.resolver.ClassNames()
	if o, ok := w.resolver.Override(device, 0); ok { // 0: even a lapsed override's classes
		for _, c := range o.Classes {
			classes = append(classes, c.Name)
		}
	}
	had, err := w.l.Reset(ctx, device, classes)
	if err != nil {
		return false, err
	}
	var notWritten error
	if w.owner != nil {
		octx, ocancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ocancel()
		owned, err := w.owner.Reset(octx, device)
		switch {
		case errors.Is(err, cluster.ErrResetNotWritten):
			notWritten = fmt.Errorf("%w: %w", admin.ErrResetNotDurable, err)
		case err != nil:
			return false, err
		}
		had = had || owned
	}
	local, err := w.local.Reset(device)
	return local || had, errors.Join(notWritten, err)
}

// blockStore is where the broker keeps automatic blocks: the data file,
// and in cluster mode Redis too, so that a block made or lifted on one
// gateway holds on all (broker.SharedBlocks).
func (g *Gateway) blockStore(store *persist.Store) broker.BlockStore {
	if g.cluster == nil {
		return store
	}
	return sharedBlockStore{Store: store, shared: g.cluster.blocks, clock: g.clock, log: g.log}
}

// sharedBlockStore writes blocks to the data file and to Redis, and
// reads them from Redis.
type sharedBlockStore struct {
	*persist.Store
	shared *cluster.Blocks
	clock  devicelimit.Clock
	log    interface {
		Error(msg string, args ...any)
	}
}

func (s sharedBlockStore) SetBlock(device string, since, until devicelimit.Tick, reason string) error {
	if err := s.shared.Set(device, until, s.clock.Now()); err != nil {
		s.log.Error("block not shared with the other gateways", "device", device, "error", err)
	}
	return s.Store.SetBlock(device, since, until, reason)
}

func (s sharedBlockStore) DeleteBlock(device string) error {
	return errors.Join(s.shared.Delete(device), s.Store.DeleteBlock(device))
}

func (s sharedBlockStore) BlockedUntil(device string) (devicelimit.Tick, bool, error) {
	return s.shared.Until(device)
}

// noDefer is why the admin API refuses overrides with policy defer: ""
// unless decisions are where the device is.
func noDefer(cfg config.Config) string {
	if cfg.Cluster.Enabled() && cfg.Cluster.Decisions == "owner" {
		return config.OwnerNoDefer
	}
	return ""
}
