package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
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
	case t.snapshotInterval.v < 0:
		return usagef("simulate: --snapshot-interval: must be > 0 (got %s)", t.snapshotInterval.v)
	case f.stormAt.v < 0 || f.stormAt.v >= f.duration.v:
		return usagef("simulate: --storm-at: must be within --duration (got %s)", f.stormAt.v)
	case f.restartAt.v < 0 || f.restartAt.v >= f.duration.v:
		return usagef("simulate: --restart-at: must be within --duration (got %s)", f.restartAt.v)
	case f.restartAt.v > 0 && !own:
		return usagef("simulate: --restart-at: needs a gateway the simulator starts (--embedded or --spawn)")
	case t.restart != "sigterm" && t.restart != "kill":
		return usagef("simulate: --restart: must be sigterm or kill (got %q)", t.restart)
	case t.restart == "kill" && !t.spawn:
		return usagef("simulate: --restart kill: only with --spawn; an embedded gateway cannot be killed apart from the simulator")
	case set["restart"] && f.restartAt.v == 0:
		return usagef("simulate: --restart: only with --restart-at")
	case set["clock-step"] && (!t.embedded || f.restartAt.v == 0):
		return usagef("simulate: --clock-step: only with --embedded and --restart-at")
	case set["upstream-outage-at"] && (t.upstream == "" || !own):
		return usagef("simulate: --upstream-outage-at: needs --upstream and a gateway the simulator starts (--embedded or --spawn), whose link it cuts")
	case t.outageAt.v < 0 || t.outageAt.v >= f.duration.v:
		return usagef("simulate: --upstream-outage-at: must be within --duration (got %s)", t.outageAt.v)
	case set["upstream-outage-at"] != set["upstream-outage-for"] || t.outageFor.v < 0:
		return usagef("simulate: --upstream-outage-at and --upstream-outage-for go together, the length > 0 (got %s)", t.outageFor.v)
	case t.upstream != "" && t.upstream != "embedded" && !isLoopbackAddr(t.upstream):
		return usagef("simulate: --upstream: \"embedded\" or a loopback host:port (got %q)", t.upstream)
	}
	return nil
}

// simulate runs a simulated fleet against a gateway until the run ends
// or ctx is cancelled, prints the summary and judges it.
func simulate(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	cfg, f, set, err := simulateConfig(args, stdout)
	if err != nil {
		return err
	}
	// Each device holds a socket, and an embedded gateway one more.
	need := uint64(cfg.Devices) + 64
	if f.target.embedded {
		need += uint64(cfg.Devices)
	}
	if limit, err := raiseFileLimit(); err == nil && limit < need {
		fmt.Fprintf(stderr, "gateway: simulate: warning: %d devices need about %d open files, the limit is %d (ulimit -n); some will fail to connect\n", cfg.Devices, need, limit)
	}
	if f.target.upstream != "" {
		own := f.target.embedded || f.target.spawn
		up, err := startSimUpstream(f.target.upstream, own)
		if err != nil {
			return err
		}
		defer up.close()
		cfg.SubAddr = up.addr
		if own {
			fw := up.forward()
			f.target.forward = &fw
		}
		if f.target.outageAt.v > 0 {
			cfg.UpstreamOutageAt, cfg.UpstreamOutageFor, cfg.UpstreamOutage = f.target.outageAt.v, f.target.outageFor.v, up.link.set
		}
		if !set["drain"] {
			cfg.Drain = time.Minute // a forwarded backlog takes its time; the drain ends when all arrived
		}
	}
	target, gcfg, err := startTarget(f, set)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*server.ShutdownTimeout)
		defer cancel()
		if cerr := target.close(cctx); cerr != nil {
			err = errors.Join(err, fmt.Errorf("simulate: stop the gateway: %w", cerr))
			return
		}
		// A spawned gateway's own figures, from its exit status.
		if c, ok := target.(*child); ok && f.jsonFile != "-" && c.cmd != nil && c.cmd.ProcessState != nil {
			if ru, ok := c.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
				cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
				fmt.Fprintf(stdout, "spawned gateway process: peak RSS %.1f MiB (%.1f KB per device), CPU %s\n",
					float64(ru.Maxrss)/1024, float64(ru.Maxrss)/float64(max(f.devices.v, 1)), cpu.Round(time.Millisecond))
			}
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
			return err
		}
	}
	if len(cfg.Mix) > 0 {
		if _, err := applyMix(ctx, target, cfg, cfg.Quota); err != nil {
			return err
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
		if f.target.clockStep.v != 0 {
			cfg.RestartMode += ", wall clock " + signed(f.target.clockStep.v)
		}
	}
	if isTerminal(stdout) && f.jsonFile != "-" {
		cfg.Progress = progressLine(stdout)
	}
	rep, err := simulator.Run(ctx, cfg)
	if cfg.Progress != nil {
		fmt.Fprint(stdout, "\r\033[K")
	}
	if errors.Is(err, simulator.ErrConnectRefused) {
		// Only the subscriber's refusal ends the run; devices' are in
		// the report.
		return fmt.Errorf("simulate: %w; the subscriber needs a consumer account (--sub-username, --sub-password-file) and a client ID it allows (--sub-client-id, default its username)", err)
	}
	if err != nil {
		return blameSimFlags(err)
	}
	return simulateOutput(ctx, rep, f, stdout, stderr)
}

// simulateOutput writes the summary, JSON and HTML reports, and turns
// the verdict into an error.
func simulateOutput(ctx context.Context, rep *simulator.Report, f *simulateFlags, stdout, stderr io.Writer) error {
	if f.jsonFile != "-" {
		if err := rep.WriteSummary(stdout); err != nil {
			return err
		}
	}
	if f.jsonFile != "" {
		if err := writeReportJSON(f.jsonFile, rep, stdout); err != nil {
			return err
		}
	}
	if f.reportFile != "" {
		if err := writeReportHTML(f.reportFile, rep); err != nil {
			return err
		}
	}
	for _, e := range rep.Errors {
		fmt.Fprintf(stderr, "gateway: simulate: %s\n", e)
	}
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "gateway: simulate: interrupted; the report covers the run so far")
	}
	if rep.Verdict.OK {
		return nil
	}
	if rep.RefusedAtConnect > 0 {
		return fmt.Errorf("simulate: FAIL: the gateway refused %d of %d devices at CONNECT (see above); check --username, --password-file or $%s, and the account's client IDs (--id-pattern)",
			rep.RefusedAtConnect, rep.Config.Devices, simPasswordEnv)
	}
	if hint := lostHint(rep, !f.target.embedded && !f.target.spawn); hint != "" {
		fmt.Fprintf(stderr, "gateway: simulate: %s\n", hint)
	}
	if len(rep.Verdict.Worst) > 0 {
		return fmt.Errorf("simulate: FAIL: worst devices: %s", strings.Join(rep.Verdict.Worst, ", "))
	}
	return errors.New("simulate: FAIL: the subscriber lost its connection, so arrivals could not all be seen")
}

// writeReportHTML writes the HTML report to the file name.
func writeReportHTML(name string, rep *simulator.Report) error {
	file, err := os.Create(name)
	if err != nil {
		return fmt.Errorf("simulate: --report: %w", err)
	}
	err = rep.WriteHTML(file)
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("simulate: --report: %w", err)
	}
	return nil
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
			r.admin = newAdminClient(t.adminAddr, token)
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
		e, err := startEmbedded(c, tmp, t.clockStep.v)
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

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	file, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := file.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressLine returns a Progress callback that redraws one line on w:
// connected devices, messages and refusals per second since the last
// call, devices over quota so far.
func progressLine(w io.Writer) func(simulator.Progress) {
	var last simulator.Progress
	return func(p simulator.Progress) {
		dt := (p.Elapsed - last.Elapsed).Seconds()
		if dt <= 0 {
			dt = 1
		}
		fmt.Fprintf(w, "\r\033[K%5.0fs  connected %s  sent/s %s  refused/s %s  over quota %d",
			p.Elapsed.Seconds(), strconv.Itoa(p.Connected),
			strconv.FormatFloat(float64(p.Sent-last.Sent)/dt, 'f', 0, 64),
			strconv.FormatFloat(float64(p.Refused-last.Refused)/dt, 'f', 0, 64), p.Over)
		last = p
	}
}

// lostHint explains lost messages in a run against a gateway the
// simulator did not start (remote): its subscriber takes every device's
// messages, and unless the gateway names it a backend consumer its
// queue is a plain subscriber's, whose overflow the gateway drops.
// Empty when nothing was lost, or the gateway is the simulator's own
// (which names its subscriber itself).
func lostHint(rep *simulator.Report, remote bool) string {
	n := rep.Result.Totals.Lost
	if n == 0 || !remote || rep.SubscriberLost {
		return ""
	}
	return fmt.Sprintf("%d acknowledged messages never reached the subscriber; if the gateway's devicegate_slow_subscriber_drops_total grew by as many, "+
		"its queue for the subscriber overflowed: name the subscriber a backend consumer in the gateway's configuration "+
		"(mqtt.consumers: {client_ids: [\"simulator-sub-*\"]}, or the --sub-client-id or username it uses; docs/simulator.md)", n)
}
