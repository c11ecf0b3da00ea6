package fleet

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/devicegate/devicegate/internal/freeport"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/server"
	"github.com/devicegate/devicegate/simulator"
)

// crashSlack is added to the snapshot interval for the persistence
// bound of a kill -9: a snapshot killed while it writes is lost with
// the admissions since the one before, and on a loaded machine the
// write and the snapshot tick itself are late by a few hundred ms.
const crashSlack = 250 * time.Millisecond

// checkTarget refuses flag combinations that make no sense together.
func (f *simulateFlags) checkTarget(set map[string]bool) error {
	t := &f.target
	own := t.embedded || t.spawn
	for _, name := range []string{"data-dir", "config", "snapshot-interval", "topic-class"} {
		if set[name] && !own {
			return usagef("simulate: --%s: only with --embedded or --spawn", name)
		}
	}
	switch {
	case t.embedded && t.spawn:
		return usagef("simulate: --embedded and --spawn: choose one")
	case own && set["addr"]:
		return usagef("simulate: --addr: not with --embedded or --spawn, which pick their own address")
	case set["gateway-bin"] && !t.spawn:
		return usagef("simulate: --gateway-bin: only with --spawn")
	case set["admin-addr"] && own:
		return usagef("simulate: --admin-addr: only with --addr; an embedded or spawned gateway is set up directly")
	case set["admin-token"] && !set["admin-addr"]:
		return usagef("simulate: --admin-token: only with --admin-addr")
	case t.snapshotInterval.V < 0:
		return usagef("simulate: --snapshot-interval: must be > 0 (got %s)", t.snapshotInterval.V)
	case f.stormAt.V < 0 || f.stormAt.V >= f.duration.V:
		return usagef("simulate: --storm-at: must be within --duration (got %s)", f.stormAt.V)
	case f.restartAt.V < 0 || f.restartAt.V >= f.duration.V:
		return usagef("simulate: --restart-at: must be within --duration (got %s)", f.restartAt.V)
	case f.restartAt.V > 0 && !own:
		return usagef("simulate: --restart-at: needs a gateway the simulator starts (--embedded or --spawn)")
	case t.restart != "sigterm" && t.restart != "kill":
		return usagef("simulate: --restart: must be sigterm or kill (got %q)", t.restart)
	case t.restart == "kill" && !t.spawn:
		return usagef("simulate: --restart kill: only with --spawn; an embedded gateway cannot be killed apart from the simulator")
	case set["restart"] && f.restartAt.V == 0:
		return usagef("simulate: --restart: only with --restart-at")
	case set["clock-step"] && (!t.embedded || f.restartAt.V == 0):
		return usagef("simulate: --clock-step: only with --embedded and --restart-at")
	case set["upstream-outage-at"] && (t.upstream == "" || !own):
		return usagef("simulate: --upstream-outage-at: needs --upstream and a gateway the simulator starts (--embedded or --spawn), whose link it cuts")
	case t.outageAt.V < 0 || t.outageAt.V >= f.duration.V:
		return usagef("simulate: --upstream-outage-at: must be within --duration (got %s)", t.outageAt.V)
	case set["upstream-outage-at"] != set["upstream-outage-for"] || t.outageFor.V < 0:
		return usagef("simulate: --upstream-outage-at and --upstream-outage-for go together, the length > 0 (got %s)", t.outageFor.V)
	case t.upstream != "" && t.upstream != "embedded" && !isLoopbackAddr(t.upstream):
		return usagef("simulate: --upstream: \"embedded\" or a loopback host:port (got %q)", t.upstream)
	}
	return nil
}

// Simulation is one run of the simulate command: the simulator's
// configuration and the gateway it runs against, read from the flags by
// ParseSimulate. Run it once.
type Simulation struct {
	// Config is the simulator's configuration; a caller may set
	// Config.Progress before Run.
	Config simulator.Config
	// JSON and Report are --json and --report: where the caller writes
	// the report ("-" for JSON on stdout).
	JSON, Report string
	// Own is true when the simulator starts the gateway (--embedded or
	// --spawn).
	Own bool
	// Warn, when not nil, is told what may spoil the run without
	// stopping it (too few open files).
	Warn func(string)

	f   *simulateFlags
	set map[string]bool
}

// Outcome is what a Simulation's Run saw.
type Outcome struct {
	Report *simulator.Report
	// Spawned is the --spawn gateway process's own usage, from its exit
	// status; nil for another target.
	Spawned *Usage
}

// Usage is a process's peak resident memory and CPU time, from its exit
// status.
type Usage struct {
	MaxRSS int64 // bytes
	CPU    time.Duration
}

// usageOf reads a finished process's usage; nil when unknown.
func usageOf(ps *os.ProcessState) *Usage {
	if ps == nil {
		return nil
	}
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok {
		return nil
	}
	return &Usage{MaxRSS: int64(ru.Maxrss) * 1024, CPU: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}
}

// Run starts the gateway the flags ask for (or finds the one at
// --addr), runs the simulator against it until the run ends or ctx is
// cancelled, and stops what it started.
func (s *Simulation) Run(ctx context.Context) (out *Outcome, err error) {
	cfg, f, set := s.Config, s.f, s.set
	// Each device holds a socket, and an embedded gateway one more.
	need := uint64(cfg.Devices) + 64
	if f.target.embedded {
		need += uint64(cfg.Devices)
	}
	if limit, err := RaiseFileLimit(); err == nil && limit < need && s.Warn != nil {
		s.Warn(fmt.Sprintf("%d devices need about %d open files, the limit is %d (ulimit -n); some will fail to connect", cfg.Devices, need, limit))
	}
	if f.target.upstream != "" {
		own := f.target.embedded || f.target.spawn
		up, err := startSimUpstream(f.target.upstream, own)
		if err != nil {
			return nil, err
		}
		defer up.close()
		cfg.SubAddr = up.addr
		if own {
			fw := up.forward()
			f.target.forward = &fw
		}
		if f.target.outageAt.V > 0 {
			cfg.UpstreamOutageAt, cfg.UpstreamOutageFor, cfg.UpstreamOutage = f.target.outageAt.V, f.target.outageFor.V, up.link.set
		}
		if !set["drain"] {
			cfg.Drain = time.Minute // a forwarded backlog takes its time; the drain ends when all arrived
		}
	}
	target, gcfg, err := startTarget(f, set)
	if err != nil {
		return nil, err
	}
	out = new(Outcome)
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*server.ShutdownTimeout)
		defer cancel()
		if cerr := target.close(cctx); cerr != nil {
			err = errors.Join(err, fmt.Errorf("simulate: stop the gateway: %w", cerr))
			return
		}
		if c, ok := target.(*child); ok && c.cmd != nil {
			out.Spawned = usageOf(c.cmd.ProcessState)
		}
	}()
	cfg.Addr = target.mqttAddr()
	if cfg.RunID == "" {
		cfg.RunID = fmt.Sprintf("%08x", rand.Uint32())
	}
	if gcfg != nil {
		// The started gateway's default quota: the config file's, with
		// the quota flags given over it. The checker judges by the same.
		cfg.Quota = gcfg.Limits.Default.Quota()
		if cfg.TopicClasses, err = topicClasses(f.topicClass, gcfg, cfg.RunID); err != nil {
			return nil, err
		}
	}
	if len(cfg.Mix) > 0 {
		if _, err := applyMix(ctx, target, cfg, cfg.Quota); err != nil {
			return nil, err
		}
	}
	if cfg.RestartAt > 0 {
		cfg.Restart = target.restarter()
		cfg.RestartMode = f.target.restart
		if f.target.restart == "kill" {
			cfg.RestartMode = "kill -9"
			// The child's own snapshot interval (flag, else its config
			// file, else the default).
			cfg.CrashLoss = time.Duration(gcfg.Persist.SnapshotInterval) + crashSlack
		}
		if f.target.clockStep.V != 0 {
			cfg.RestartMode += ", wall clock " + signed(f.target.clockStep.V)
		}
	}
	out.Report, err = simulator.Run(ctx, cfg)
	if errors.Is(err, simulator.ErrConnectRefused) {
		// Only the subscriber's refusal ends the run; devices' are in
		// the report.
		return nil, fmt.Errorf("simulate: %w; the subscriber needs a consumer account (--sub-username, --sub-password-file) and a client ID it allows (--sub-client-id, default its username)", err)
	}
	if err != nil {
		return nil, blameSimFlags(err)
	}
	return out, nil
}

// startTarget starts the gateway the flags ask for, or describes the
// running one at --addr. gcfg is the started gateway's configuration
// (nil for --addr).
func startTarget(f *simulateFlags, set map[string]bool) (target simTarget, gcfg *config.Config, err error) {
	t := &f.target
	if !t.embedded && !t.spawn {
		r := &remote{addr: f.addr}
		if t.adminAddr != "" {
			token := t.adminToken
			if token == "" {
				token = os.Getenv("GATEWAY_ADMIN_TOKEN")
			}
			if token == "" {
				return nil, nil, usagef("simulate: --admin-addr: needs --admin-token or $GATEWAY_ADMIN_TOKEN")
			}
			r.admin = adminClient(t.adminAddr, token)
		}
		return r, nil, nil
	}
	dataDir, tmp := t.dataDir, ""
	if dataDir == "" {
		var err error
		if tmp, err = newTempDataDir(); err != nil {
			return nil, nil, err
		}
		dataDir = tmp
	}
	fail := func(err error) (simTarget, *config.Config, error) {
		if tmp != "" {
			os.RemoveAll(tmp)
		}
		return nil, nil, err
	}
	mqttAddr := "127.0.0.1:0"
	if t.spawn {
		// A restarted child must come back on the same port.
		var err error
		if mqttAddr, err = freeport.Addr(); err != nil {
			return fail(fmt.Errorf("simulate: pick a port: %w", err))
		}
	}
	c, err := f.gatewayConfig(dataDir, mqttAddr, set)
	if err != nil {
		return fail(fmt.Errorf("simulate: gateway settings: %w", err))
	}
	gcfg = &c
	if t.embedded {
		e, err := startEmbedded(c, tmp, t.clockStep.V)
		if err != nil {
			return fail(err)
		}
		return e, gcfg, nil
	}
	bin := t.gatewayBin
	if bin == "" {
		if bin, err = os.Executable(); err != nil {
			return fail(fmt.Errorf("simulate: --spawn: find this binary: %w", err))
		}
	}
	// The child reads the same configuration from a file of its own.
	cfgDir, err := os.MkdirTemp("", "devicegate-sim-config-*")
	if err != nil {
		return fail(fmt.Errorf("simulate: --spawn: %w", err))
	}
	cfgFile, err := writeConfigFile(cfgDir, c)
	if err != nil {
		os.RemoveAll(cfgDir)
		return fail(fmt.Errorf("simulate: --spawn: %w", err))
	}
	ch, err := startChild(bin, []string{"--config", cfgFile}, dataDir, []string{tmp, cfgDir}, t.restart == "kill")
	if err != nil {
		return nil, nil, fmt.Errorf("simulate: --spawn: %w", err)
	}
	return ch, gcfg, nil
}

// isLoopbackAddr reports whether addr is a loopback host:port.
func isLoopbackAddr(addr string) bool {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return false
	}
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}

// signed formats d with its sign.
func signed(d time.Duration) string {
	if d > 0 {
		return "+" + d.String()
	}
	return d.String()
}
