package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/freeport"
	"github.com/devicegate/devicegate/simulator"
)

// Spec describes a run of the fleet harness: gateways in cluster mode
// sharing Redis, optionally behind HAProxy, a fleet of simulated devices
// split over as many simulator processes as the open-file limit needs,
// and the faults injected. Phase 1: every device at Rate (a gateway
// killed at KillGatewayAt); phase 2: the tenant's devices at TenantRate
// (a Redis server or Cluster master killed at KillRedisAt into it).
type Spec struct {
	// Bin is the gateway binary; Worker the binary that runs a Share
	// when workerEnv is set (the fleet test binary).
	Bin, Worker string
	// Dir holds the processes' files.
	Dir string

	Gateways int
	// RedisMasters is 0 for one redis-server, else the masters of a
	// Redis Cluster with RedisReplicas replicas each.
	RedisMasters, RedisReplicas int
	// HAProxy, when set, is a configuration as docs/operations.md gives
	// it, run in front of the gateways; devices then connect to it
	// instead of to the gateways' list.
	HAProxy string
	// Standalone runs a gateway without Redis side by side, loaded as
	// one gateway of the cluster (Devices / Gateways devices at Rate):
	// the cost of cluster mode against it.
	Standalone bool

	Devices  int
	Rate     float64 // messages per device per second
	Duration time.Duration
	RampUp   float64 // connections per second per simulator process; 0 all at once
	Quota    devicelimit.Quota
	StormAt  time.Duration // every device reconnects once (hops), 0 none

	KillGatewayAt time.Duration // into phase 1, 0 none: the last gateway gets SIGKILL

	TenantDevices  int
	TenantRate     float64
	TenantDuration time.Duration
	KillRedisAt    time.Duration // into phase 2, 0 none: the first Redis server gets SIGKILL
	// TenantGroup, when set, puts phase 2's devices in one tenant group
	// of these windows (GatewaySpec.TenantGroup): with cluster.decisions
	// owner its windows are decided on grants.
	TenantGroup []devicelimit.Limit

	// RedisTimeout is the gateways' cluster.redis.timeout; default 1 s,
	// so that a loaded test machine's slow answers do not send
	// decisions to the failure policy (Phase.Fallbacks counts those
	// that still do).
	RedisTimeout time.Duration
	// Decisions is the gateways' cluster.decisions ("redis" or
	// "owner"); default the gateway's (owner).
	Decisions string

	// PerProcess bounds the devices of one simulator process; default
	// the open-file hard limit less 1,000 (sockets of subscribers, the
	// runtime, files).
	PerProcess int
	// Log, when set, is told of progress.
	Log func(format string, args ...any)
}

// Phase is what one phase of a fleet run measured.
type Phase struct {
	Name    string
	Devices int
	Shares  int // simulator processes
	Wall    time.Duration
	Totals  simulator.Counts
	// Violations are devices the window check found over quota;
	// WorstWindow the largest count of admitted messages in any window
	// of T of any device, against Limit.
	Violations, WorstWindow, Limit int
	// AllConnected is the slowest share's time to have every device
	// connected (0: some share never had them all at once);
	// ConnectFailures the devices that never connected.
	AllConnected    time.Duration
	ConnectFailures int
	// PubackP50 is the shares' p50s averaged by messages; PubackP99 the
	// largest of their p99s.
	PubackP50, PubackP99 time.Duration
	// Failovers are the times from a lost connection to the device's
	// next admitted message, all shares, ascending.
	Failovers simulator.FailoverTimes
	// Readmitted are the instants those devices were admitted again,
	// ascending.
	Readmitted []time.Time
	// GatewayCPU is each gateway's CPU time over the phase; GatewayRSS
	// its resident memory at the end (0 for a killed one).
	GatewayCPU []time.Duration
	GatewayRSS []int64
	// Redis is Redis's counters over the phase (servers killed during
	// it count only until then).
	Redis RedisStats
	// Fallbacks counts the decisions the gateways' failure policy made
	// (Redis slower than the timeout, or down), over the phase.
	Fallbacks float64
	// GrantClaims and GrantMessages are the gateways' group grant claims
	// and the messages they were granted over the phase (of the gateways
	// running at its end; devicegate_cluster_group_grant_*).
	GrantClaims, GrantMessages float64
	// Standalone is the side-by-side standalone gateway's CPU time and
	// its share's counts; zero without Spec.Standalone.
	StandaloneCPU     time.Duration
	StandaloneRSS     int64
	StandaloneTotals  simulator.Counts
	StandaloneDevices int
	// Steady is the phase at steady state (steady.go).
	Steady Steady
	// SimulatorCPU is the simulator processes' CPU time over the phase
	// (phase 1 only: the processes killed in phase 2 blur it), the
	// standalone gateway's share included.
	SimulatorCPU time.Duration
	Errors       []string
}

// Report is a fleet run's phases and events.
type Report struct {
	Spec                         Spec
	FileLimit                    uint64
	Phases                       []Phase
	Phase1Started, Phase2Started time.Time
	GatewayKilled, RedisKilled   time.Time
	RedisKilledAddr              string
	// RedisClusterOK is how long after the master's kill the Redis
	// Cluster served every slot again (a replica promoted); 0 when not
	// a Cluster, or not within a minute.
	RedisClusterOK time.Duration
}

// at runs f after d (never when d is 0) and returns a function that
// cancels f if it has not started, or waits until it has returned.
func at(d time.Duration, f func()) (wait func()) {
	if d <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	t := time.AfterFunc(d, func() { defer close(done); f() })
	return func() {
		if !t.Stop() {
			<-done
		}
	}
}

// Run runs the fleet described by spec and stops every process it
// started.
func Run(ctx context.Context, spec Spec) (rep *Report, err error) {
	logf := spec.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	limit, err := RaiseFileLimit()
	if err != nil {
		return nil, fmt.Errorf("raise the open-file limit: %w", err)
	}
	if spec.RedisTimeout == 0 {
		spec.RedisTimeout = time.Second
	}
	if spec.PerProcess <= 0 {
		spec.PerProcess = int(limit) - 1000
	}
	if spec.PerProcess <= 0 || uint64(spec.PerProcess) > limit {
		return nil, fmt.Errorf("%d devices per simulator process with an open-file limit of %d", spec.PerProcess, limit)
	}
	rep = &Report{Spec: spec, FileLimit: limit}
	if per := survivorLoad(spec); uint64(per)+1000 > limit {
		// Each gateway inherits this process's limit: the survivors of
		// the kill cannot take every device back.
		logf("warning: after the kill each of the %d other gateways holds about %d devices, over its open-file limit %d less 1,000: some devices will not connect again",
			spec.Gateways-1, per, limit)
	}
	redis, err := StartRedis(spec.Dir, spec.RedisMasters, spec.RedisReplicas)
	if err != nil {
		return nil, err
	}
	defer redis.Close()
	seeds := redis.Addrs[:max(1, spec.RedisMasters)]
	gws, err := StartGateways(filepath.Join(spec.Dir, "cluster"), spec.Gateways, GatewaySpec{Bin: spec.Bin, Redis: seeds, Quota: spec.Quota,
		RedisTimeout: spec.RedisTimeout, Decisions: spec.Decisions, BehindBalancer: spec.HAProxy != "", TenantGroup: spec.TenantGroup})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, gws.Close()) }()
	logf("started %d gateways and %d redis-server processes", spec.Gateways, len(redis.Procs))
	addrs := gws.Addrs
	if spec.HAProxy != "" {
		listen, err := freeport.Addr()
		if err != nil {
			return nil, err
		}
		cfg, err := HAProxyConfig(spec.HAProxy, listen, gws.Addrs)
		if err != nil {
			return nil, err
		}
		hp, err := StartHAProxy(spec.Dir, listen, cfg)
		if err != nil {
			return nil, err
		}
		defer hp.Kill()
		addrs = []string{hp.Addr}
	}
	var alone *Gateways
	if spec.Standalone {
		if alone, err = StartGateways(filepath.Join(spec.Dir, "standalone"), 1, GatewaySpec{Bin: spec.Bin, Quota: spec.Quota}); err != nil {
			return nil, err
		}
		defer func() { err = errors.Join(err, alone.Close()) }()
	}

	// Phase 1: every device; a gateway killed under load.
	p1 := Share{Devices: spec.Devices, Rate: spec.Rate, Duration: spec.Duration, RampUp: spec.RampUp,
		Limit: spec.Quota.Limit, Window: spec.Quota.Window, Addrs: addrs, SubAddrs: gws.Addrs, StormAt: spec.StormAt}
	shares := split(p1, "p1", spec.PerProcess)
	if alone != nil {
		s := p1
		s.Devices, s.IDPattern, s.Addrs, s.SubAddrs, s.StormAt = max(1, spec.Devices/spec.Gateways), "alone-%07d", alone.Addrs, alone.Addrs, 0
		s.Sources = sources(250)
		shares = append(shares, s)
	}
	rep.Phase1Started = time.Now()
	children := childrenCPU()
	var killedCPU time.Duration
	waitKill := at(spec.KillGatewayAt, func() {
		rep.GatewayKilled = time.Now()
		killedCPU = gws.Stats()[gws.Len()-1].CPU // counted in childrenCPU once reaped
		_ = gws.Kill(gws.Len() - 1)
		logf("gateway %d killed (SIGKILL)", gws.Len()-1)
	})
	steady := watchPhase(ctx, spec, spec.Devices, spec.Rate, spec.KillGatewayAt, spec.Duration, gws, alone, redis)
	ph, err := runPhase(ctx, spec, "all devices", shares, alone != nil, gws, alone, redis)
	ph.Steady = steady()
	waitKill()
	ph.SimulatorCPU = max(0, childrenCPU()-children-killedCPU)
	rep.Phases = append(rep.Phases, ph)
	if err != nil || spec.TenantDevices == 0 {
		return rep, err
	}

	// Phase 2: one tenant's devices, faster; a Redis server killed.
	p2 := Share{Devices: spec.TenantDevices, Rate: spec.TenantRate, Duration: spec.TenantDuration, RampUp: spec.RampUp,
		Limit: spec.Quota.Limit, Window: spec.Quota.Window, Addrs: addrs, SubAddrs: liveAddrs(gws)}
	waitKill = at(spec.KillRedisAt, func() {
		redis.Stats(ctx) // its counters so far count in the phase's
		rep.RedisKilled, rep.RedisKilledAddr = time.Now(), redis.Addrs[0]
		redis.Procs[0].Kill()
		logf("redis-server %s killed (SIGKILL)", redis.Addrs[0])
		if spec.RedisMasters > 0 {
			rep.RedisClusterOK = redis.waitClusterOK(ctx, redis.Addrs[0], time.Minute)
			logf("redis cluster serves every slot again after %s", rep.RedisClusterOK)
		}
	})
	defer waitKill()
	rep.Phase2Started = time.Now()
	steady = watchPhase(ctx, spec, spec.TenantDevices, spec.TenantRate, spec.KillRedisAt, spec.TenantDuration, gws, nil, redis)
	ph, err = runPhase(ctx, spec, "one tenant", split(p2, TenantPrefix, spec.PerProcess), false, gws, nil, redis)
	ph.Steady = steady()
	rep.Phases = append(rep.Phases, ph)
	return rep, err
}

// SinceKill returns how long after killed the share q (0 < q <= 1) of
// the devices that lost their connection was admitted again; 0 when
// none was or nothing was killed.
func (p Phase) SinceKill(killed time.Time, q float64) time.Duration {
	var after []time.Duration
	for _, t := range p.Readmitted {
		if !killed.IsZero() && t.After(killed) {
			after = append(after, t.Sub(killed))
		}
	}
	return simulator.FailoverTimes(after).Quantile(q)
}

// survivorLoad is the devices each gateway holds when one has been
// killed (all gateways when none is).
func survivorLoad(spec Spec) int {
	n := spec.Gateways
	if spec.KillGatewayAt > 0 && n > 1 {
		n--
	}
	return (spec.Devices + n - 1) / n
}

// liveAddrs returns the addresses of the gateways still running.
func liveAddrs(g *Gateways) []string {
	var out []string
	for i, a := range g.Addrs {
		if g.Alive(i) {
			out = append(out, a)
		}
	}
	return out
}

// split cuts s into shares of at most per devices, each with device IDs
// of its own (prefix, the share's number, the device's) and source
// addresses of its own (sources).
func split(s Share, prefix string, per int) []Share {
	n := (s.Devices + per - 1) / per
	out := make([]Share, 0, n)
	for k := range n {
		c := s
		c.Devices = min(per, s.Devices-k*per)
		c.IDPattern = fmt.Sprintf("%s-%02d-%%07d", prefix, k)
		c.Sources = sources(k + 1)
		out = append(out, c)
	}
	return out
}

// sourcesPerShare is how many loopback source addresses a share's
// devices dial from: at a gateway's default 100 connections per address
// that have not sent CONNECT yet, 64 addresses let 6,400 connections per
// share wait for a loaded gateway to read them.
const sourcesPerShare = 64

// sources returns the k'th share's source addresses, 127.0.k.1 to
// 127.0.k.64 (Linux answers on all of 127.0.0.0/8).
func sources(k int) []string {
	out := make([]string, sourcesPerShare)
	for i := range out {
		out[i] = fmt.Sprintf("127.0.%d.%d", k, i+1)
	}
	return out
}

// runPhase runs shares at once (the last one on the standalone gateway
// when alone is not nil) and measures the gateways and Redis around
// them.
func runPhase(ctx context.Context, spec Spec, name string, shares []Share, lastAlone bool, gws, alone *Gateways, redis *Redis) (Phase, error) {
	ph := Phase{Name: name, Shares: len(shares), Limit: spec.Quota.Limit}
	g0, r0, f0 := gws.Stats(), redis.Stats(ctx), gws.Fallbacks(ctx)
	c0, m0 := grantCounts(ctx, gws)
	var a0 []ProcStats
	if alone != nil {
		a0 = alone.Stats()
	}
	dir, err := os.MkdirTemp(spec.Dir, "shares-")
	if err != nil {
		return ph, err
	}
	start := time.Now()
	results, err := runShares(ctx, spec.Worker, dir, shares)
	ph.Wall = time.Since(start)
	g1, r1 := gws.Stats(), redis.Stats(ctx)
	ph.Redis, ph.Fallbacks = r1.Sub(r0), max(0, gws.Fallbacks(ctx)-f0)
	c1, m1 := grantCounts(ctx, gws)
	ph.GrantClaims, ph.GrantMessages = max(0, c1-c0), max(0, m1-m0)
	for i := range g1 {
		ph.GatewayCPU = append(ph.GatewayCPU, max(0, g1[i].CPU-g0[i].CPU))
		ph.GatewayRSS = append(ph.GatewayRSS, g1[i].RSS)
	}
	if alone != nil {
		a1 := alone.Stats()
		ph.StandaloneCPU, ph.StandaloneRSS = a1[0].CPU-a0[0].CPU, a1[0].RSS
	}
	if err != nil {
		return ph, err
	}
	var p50sum float64
	allOnce := true
	for i, r := range results {
		if lastAlone && i == len(results)-1 {
			ph.StandaloneTotals, ph.StandaloneDevices = r.Totals, r.Devices
			continue
		}
		ph.Devices += r.Devices
		ph.Totals.Add(r.Totals)
		ph.Violations += r.Violations
		ph.WorstWindow = max(ph.WorstWindow, r.WorstWindow)
		ph.AllConnected = max(ph.AllConnected, r.AllConnected)
		if r.AllConnected == 0 {
			allOnce = false
		}
		ph.ConnectFailures += r.ConnectFailures
		p50sum += float64(r.Puback.LatencyP50) * float64(r.Totals.Acked)
		ph.PubackP99 = max(ph.PubackP99, r.Puback.LatencyP99)
		ph.Failovers = append(ph.Failovers, r.Failovers...)
		ph.Readmitted = append(ph.Readmitted, r.Readmitted...)
		ph.Errors = append(ph.Errors, r.Errors...)
	}
	if !allOnce {
		ph.AllConnected = 0
	}
	if ph.Totals.Acked > 0 {
		ph.PubackP50 = time.Duration(p50sum / float64(ph.Totals.Acked))
	}
	sort.Slice(ph.Failovers, func(a, b int) bool { return ph.Failovers[a] < ph.Failovers[b] })
	sort.Slice(ph.Readmitted, func(a, b int) bool { return ph.Readmitted[a].Before(ph.Readmitted[b]) })
	return ph, nil
}

// grantCounts reads the gateways' group grant claims and the messages
// they were granted so far.
func grantCounts(ctx context.Context, gws *Gateways) (claims, messages float64) {
	return gws.Metric(ctx, "devicegate_cluster_group_grant_claims_total"),
		gws.Metric(ctx, `devicegate_cluster_group_grant_units_total{unit="messages"}`)
}
