package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// forwardOptions shape `make bench-forward` (-mode forward).
type forwardOptions struct {
	backlog int    // messages in the backlog drained after the outage
	keys    string // more keys of every forward: entry
}

// forwardTargets are the three setups of the forwarding benchmark, each
// with its publishers' broker and its subscribers' broker.
type forwardTarget struct {
	name     string
	pub, sub string
	proc     *proc // the process the publishers talk to, for CPU
	// dest is a stream's server process (nil for kfake and the rest).
	dest *proc
	// fwd is the forwarding gateway, if the setup is one; one
	// forwarding into a stream has no sub: its rounds have no
	// subscribers and measure what the stream took.
	fwd *forwardingGateway
}

func (t forwardTarget) stream() bool { return t.fwd != nil && t.sub == "" }

// forwardBench is `make bench-forward`: side by side in one run, QoS 1,
// o.publishers publishers: the gateway without forwarding (subscribers
// on the gateway), the gateway forwarding to Mosquitto (subscribers on
// the Mosquitto), and Mosquitto's own bridge (Mosquitto -> Mosquitto,
// subscribers on the second). Then the forwarding gateway's upstream is
// stopped, a backlog of fo.backlog messages builds, the upstream comes
// back and the drain is timed, with the gateway's anonymous memory.
func forwardBench(ctx context.Context, dir string, o options, fo forwardOptions, mosquitto string) error {
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	keep := func(p *proc) *proc {
		if p != nil {
			procs = append(procs, p)
		}
		return p
	}
	plain, _, err := startGateway(dir, false)
	keep(gwProc(plain))
	if err != nil {
		return err
	}
	upAddr, upConf, up, err := startMosquittoConf(dir, mosquitto, "upstream", "")
	keep(up)
	if err != nil {
		return err
	}
	withKeys := func(keys string) string {
		if fo.keys != "" {
			return keys + ", " + fo.keys
		}
		return keys
	}
	pprof := o.profile != ""
	fwd, err := startForwardingGateway(dir, "mqtt", withKeys(fmt.Sprintf(`to: "mqtt://%s"`, upAddr)), pprof)
	keep(fwdProc(fwd))
	if err != nil {
		return err
	}
	streams, closeStreams, err := startStreams(ctx, dir, keep)
	defer closeStreams()
	if err != nil {
		return err
	}
	bridgeUpAddr, _, bridgeUp, err := startMosquittoConf(dir, mosquitto, "bridge-upstream", "")
	keep(bridgeUp)
	if err != nil {
		return err
	}
	bridge := "connection up\naddress " + bridgeUpAddr + "\ntopic bench/# out 1\nbridge_protocol_version mqttv311\ncleansession true\n"
	bridgeAddr, _, bridgeProc, err := startMosquittoConf(dir, mosquitto, "bridge", bridge)
	keep(bridgeProc)
	if err != nil {
		return err
	}
	targets := []forwardTarget{
		{setupPlain, plain.addr, plain.addr, plain.p, nil, nil},
		{setupForward, fwd.addr, upAddr, fwd.p, nil, fwd},
		{setupBridge, bridgeAddr, bridgeUpAddr, bridgeProc, nil, nil},
	}
	for i, s := range streams {
		g, err := startForwardingGateway(dir, "stream-"+strconv.Itoa(i), withKeys(s.keys), pprof)
		keep(fwdProc(g))
		if err != nil {
			return err
		}
		targets = append(targets, forwardTarget{s.name, g.addr, "", g.p, s.proc, g})
	}
	var fwdBase *forwardingGateway
	if o.label != "" {
		// The baseline's forwarders, to the same destinations, in the
		// same rounds: "... @label" beside each setup of this build. Its
		// MQTT forwarder has a client ID of its own: with the default
		// (host and entry name) the two would take over each other's
		// session at the shared upstream.
		fwdBase, err = startForwardingGatewayOf(dir, "mqtt-baseline", baselineBin(dir), withKeys(fmt.Sprintf(`to: "mqtt://%s", client_id: devicegate-bench-baseline`, upAddr)), false)
		keep(fwdProc(fwdBase))
		if err != nil {
			return err
		}
		base := []forwardTarget{{"gateway @" + o.label + " -> mosquitto", fwdBase.addr, upAddr, fwdBase.p, nil, fwdBase}}
		for i, s := range streams {
			g, err := startForwardingGatewayOf(dir, "stream-baseline-"+strconv.Itoa(i), baselineBin(dir), withKeys(s.keys), false)
			keep(fwdProc(g))
			if err != nil {
				return err
			}
			base = append(base, forwardTarget{baselineName(s.name, o.label), g.addr, "", g.p, s.proc, g})
		}
		targets = besideBaseline(targets, base, o.label)
	}
	results := map[string][]result{}
	for r := range o.rounds {
		for i := range targets {
			tg := targets[(i+r)%len(targets)]
			var res result
			var err error
			if tg.stream() {
				res, err = streamRound(ctx, dir, o, tg.fwd, tg.dest)
			} else {
				res, err = loadRound(ctx, dir, o, tg.pub, tg.sub, o.subscribers, o.duration, tg.proc)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", tg.name, err)
			}
			fmt.Fprintf(os.Stderr, "round %d %-30s received %8.0f/s delivered upstream %8.0f/s ack p50 %.1f ms p99 %.1f ms\n",
				r+1, tg.name, res.ReceivedPS, res.DeliveredPS, res.AckP50, res.AckP99)
			results[tg.name] = append(results[tg.name], res)
		}
	}
	if pprof {
		if err := profileForwarding(ctx, dir, o, targets); err != nil {
			return err
		}
	}
	d, up, err := drain(ctx, dir, o, fo, fwd, up, upAddr, upConf, mosquitto, keep)
	if err != nil {
		return err
	}
	var dBase drained
	if fwdBase != nil {
		// The same outage and backlog for the baseline's forwarder, after
		// this build's: the order favours neither (the machine is as busy).
		if dBase, _, err = drain(ctx, dir, o, fo, fwdBase, up, upAddr, upConf, mosquitto, keep); err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
	}
	printForwardTable(os.Stdout, o, targets, results, d, dBase)
	if fwdBase != nil {
		printForwardComparison(os.Stdout, o, targets, results, d, dBase)
	}
	return nil
}

// besideBaseline puts each of the baseline's setups right after the
// same setup of this build, so that the two compared run one after the
// other in every round (with one round, minutes apart otherwise, under
// whatever else the machine did meanwhile).
func besideBaseline(targets, base []forwardTarget, label string) []forwardTarget {
	var out []forwardTarget
	for _, tg := range targets {
		out = append(out, tg)
		for _, b := range base {
			if tg.fwd != nil && b.name == baselineName(tg.name, label) {
				out = append(out, b)
			}
		}
	}
	return out
}

// The setups every forward run has, by name.
const (
	setupPlain   = "gateway, no forwarding"
	setupForward = "gateway -> mosquitto"
	setupBridge  = "mosquitto bridge -> mosquitto"
)

// fwdProc is g's process, or nil.
func fwdProc(g *forwardingGateway) *proc {
	if g == nil {
		return nil
	}
	return gwProc(g.gateway)
}

func gwProc(g *gateway) *proc {
	if g == nil {
		return nil
	}
	return g.p
}

// forwardingGateway is the gateway that forwards, with its admin API.
type forwardingGateway struct {
	*gateway
	admin, token string
	pprof        string // its net/http/pprof address, if it serves one
}

const forwardGatewayConfig = `mqtt: {tcp: "127.0.0.1:0"}
admin: {addr: "127.0.0.1:0"}
data_dir: %q
limits:
  default: {limit: 1000000000, window: 1s, policy: drop}
forward:
  - {name: up, topics: ["bench/#"], %s}
`

// startForwardingGateway starts a gateway named name forwarding bench/#
// to the destination keys choose (`to: ...` and its kind's keys); with
// pprof it serves net/http/pprof.
func startForwardingGateway(dir, name, keys string, pprof bool) (*forwardingGateway, error) {
	return startForwardingGatewayOf(dir, name, dir+"/gateway", keys, pprof)
}

// startForwardingGatewayOf is startForwardingGateway of the gateway
// binary bin.
func startForwardingGatewayOf(dir, name, bin, keys string, pprof bool) (*forwardingGateway, error) {
	conf := dir + "/gateway-forward-" + name + ".yaml"
	data := dir + "/data-forward-" + name
	if err := os.WriteFile(conf, fmt.Appendf(nil, forwardGatewayConfig, data, keys), 0o644); err != nil {
		return nil, err
	}
	var env []string
	var pprofAddr string
	if pprof {
		var err error
		if pprofAddr, err = freePort(); err != nil {
			return nil, err
		}
		env = append(env, "BENCH_PPROF_ADDR="+pprofAddr)
	}
	p, err := start(dir, "gateway-forward-"+name, env, bin, "serve", "--config", conf)
	if err != nil {
		return nil, err
	}
	g := &forwardingGateway{gateway: &gateway{p: p}, pprof: pprofAddr}
	if g.addr, err = p.waitLog(regexp.MustCompile(`msg="mqtt listening" addr=(\S+)`), 15*time.Second); err != nil {
		return g, err
	}
	if g.admin, err = p.waitLog(regexp.MustCompile(`msg="admin listening" addr=(\S+)`), 15*time.Second); err != nil {
		return g, err
	}
	tok, err := os.ReadFile(data + "/admin.token")
	g.token = strings.TrimSpace(string(tok))
	return g, err
}

// upstream is GET /api/v1/forward's first upstream.
type upstream struct {
	Connected int   `json:"connected"`
	Forwarded int64 `json:"forwarded"`
	Backlog   int64 `json:"backlog_messages"`
}

func (g *forwardingGateway) status(ctx context.Context) (upstream, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.admin+"/api/v1/forward", nil)
	req.Header.Set("Authorization", "Bearer "+g.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return upstream{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var v struct {
		Upstreams []upstream `json:"upstreams"`
	}
	if err := json.Unmarshal(b, &v); err != nil || len(v.Upstreams) != 1 {
		return upstream{}, fmt.Errorf("GET /api/v1/forward: %q: %v", b, err)
	}
	return v.Upstreams[0], nil
}

// rssAnon is the process's anonymous resident memory (/proc/PID/status;
// the data file's mapped pages are not anonymous).
func rssAnon(p *proc) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RssAnon:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("%s: no RssAnon in /proc status", p.name)
}

// drained is what the backlog phase measured.
type drained struct {
	backlog                       int64
	fill                          time.Duration // building the backlog
	reconnect                     time.Duration // from the upstream back to the first message acknowledged (the forwarder's backoff)
	drain                         time.Duration // from then to an empty log
	idle, peakFill, peakDrain     int64         // RssAnon bytes
	idleAfterRounds, afterDrained int64
}

// drain stops the upstream, publishes until the forwarding gateway's
// backlog holds fo.backlog messages, restarts the upstream on the same
// port and times the backlog's drain, sampling the gateway's RssAnon.
func drain(ctx context.Context, dir string, o options, fo forwardOptions, g *forwardingGateway, up *proc, upAddr, upConf, mosquitto string, keep func(*proc) *proc) (drained, *proc, error) {
	var d drained
	var err error
	if d.idleAfterRounds, err = rssAnon(g.p); err != nil {
		return d, nil, err
	}
	up.stop()
	fmt.Fprintf(os.Stderr, "backlog: upstream stopped; publishing until %d messages wait\n", fo.backlog)
	began := time.Now()
	for {
		st, err := g.status(ctx)
		if err != nil {
			return d, nil, err
		}
		if st.Backlog >= int64(fo.backlog) {
			d.backlog = st.Backlog
			break
		}
		// A round as long as the rest should take at 20,000/s, at most 10 s.
		rest := time.Duration(float64(int64(fo.backlog)-st.Backlog)/20000*float64(time.Second)) + time.Second
		if _, err := loadRound(ctx, dir, o, g.addr, g.addr, 0, min(rest, 10*time.Second), g.p); err != nil {
			return d, nil, err
		}
		rss, err := rssAnon(g.p)
		if err != nil {
			return d, nil, err
		}
		d.peakFill = max(d.peakFill, rss)
		fmt.Fprintf(os.Stderr, "backlog: %d messages, gateway RssAnon %d MiB\n", st.Backlog, rss>>20)
	}
	d.fill = time.Since(began)
	if d.idle, err = rssAnon(g.p); err != nil { // at rest with the backlog
		return d, nil, err
	}
	d.peakFill = max(d.peakFill, d.idle)
	p, err := start(dir, up.name+"-again", nil, mosquitto, "-c", upConf)
	if err != nil {
		return d, nil, err
	}
	keep(p)
	if err := waitDial(upAddr, 10*time.Second); err != nil {
		return d, p, err
	}
	back := time.Now()
	var first upstream
	if first, err = g.status(ctx); err != nil {
		return d, nil, err
	}
	began = time.Time{}
	for {
		st, err := g.status(ctx)
		if err != nil {
			return d, nil, err
		}
		if began.IsZero() && st.Forwarded > first.Forwarded {
			// Sending has begun: the drain is timed from here, after
			// the forwarder's reconnection backoff.
			began = time.Now()
			d.reconnect = began.Sub(back)
			d.backlog = st.Backlog
		}
		rss, err := rssAnon(g.p)
		if err != nil {
			return d, nil, err
		}
		d.peakDrain = max(d.peakDrain, rss)
		if st.Backlog == 0 && !began.IsZero() {
			break
		}
		if time.Since(back) > 10*time.Minute {
			return d, p, fmt.Errorf("backlog not drained in 10 minutes (%d left)", st.Backlog)
		}
		time.Sleep(20 * time.Millisecond) // sampling the drain
	}
	d.drain = time.Since(began)
	d.afterDrained, err = rssAnon(g.p)
	return d, p, err
}

func printForwardTable(w io.Writer, o options, targets []forwardTarget, results map[string][]result, d, base drained) {
	fmt.Fprintf(w, "\n%d publishers (QoS 1, window %d), %d subscribers upstream, 64-byte payloads, %d rounds of %s; median (min–max)\n\n",
		o.publishers, o.inflight, o.subscribers, o.rounds, o.duration)
	fmt.Fprintln(w, "| setup | received msgs/s | delivered upstream (streams: into the stream) msgs/s | delivered / acknowledged | ack p50 ms | ack p99 ms |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, tg := range targets {
		rs := results[tg.name]
		share := spreadOf(column(rs, func(r result) float64 { return float64(r.Delivered) / float64(r.Published) }))
		fmt.Fprintf(w, "| %s | %s | %s | %.2f (%.2f–%.2f) | %s | %s |\n", tg.name, spreadOf(column(rs, received)), spreadOf(column(rs, delivered)),
			share.med, share.lo, share.hi,
			spreadOf(column(rs, func(r result) float64 { return r.AckP50 })), spreadOf(column(rs, func(r result) float64 { return r.AckP99 })))
	}
	med := func(name string) float64 { return spreadOf(column(results[name], delivered)).med }
	fw, plain, br := med(setupForward), med(setupPlain), med(setupBridge)
	verdict := func(ok bool) string { return map[bool]string{true: "met", false: "not met"}[ok] }
	fmt.Fprintln(w, "\n| goal | measured | |")
	fmt.Fprintln(w, "|---|---|---|")
	fmt.Fprintf(w, "| forwarding ≥ 0.95 × the gateway without forwarding (delivered) | %.2f | %s |\n", fw/plain, verdict(fw/plain >= 0.95))
	fmt.Fprintf(w, "| forwarding ≥ 1.0 × Mosquitto's bridge (delivered) | %.2f | %s |\n", fw/br, verdict(fw/br >= 1.0))
	in := spreadOf(column(results[setupPlain], received)).med
	for _, tg := range targets {
		if tg.stream() {
			r := med(tg.name) / in
			fmt.Fprintf(w, "| %s: into the stream ≥ 0.95 × the gateway without forwarding (received) | %.2f | %s |\n", tg.name, r, verdict(r >= 0.95))
		}
	}
	fmt.Fprint(w, drainGoal(d, base, o.label))
	grow := max(d.peakFill, d.peakDrain) - d.idleAfterRounds
	fmt.Fprintf(w, "| RssAnon with the backlog within 100 MiB of idle | idle %d MiB, backlog at rest %d MiB, peak filling %d MiB, peak draining %d MiB, after %d MiB: +%d MiB | %s |\n",
		d.idleAfterRounds>>20, d.idle>>20, d.peakFill>>20, d.peakDrain>>20, d.afterDrained>>20, grow>>20, verdict(grow <= 100<<20))
	fmt.Fprintln(w, "\n| stream | gateway CPU µs per message (publishing) | stream server CPU µs per message (publishing and drain) |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, tg := range targets {
		if tg.stream() {
			dest := "in the harness"
			if tg.dest != nil {
				dest = spreadOf(column(results[tg.name], func(r result) float64 { return float64(r.DestCPU.Microseconds()) / float64(r.Published) })).String()
			}
			fmt.Fprintf(w, "| %s | %s | %s |\n", tg.name, spreadOf(column(results[tg.name], cpuPerMsg)), dest)
		}
	}
	fmt.Fprintf(w, "\nThe backlog took %s to build through the gateway (upstream stopped); once the upstream was back, the forwarder's\n", d.fill.Round(time.Millisecond))
	fmt.Fprintf(w, "reconnection backoff took %s before the first acknowledgement, and the drain is timed from then. Idle is the forwarding gateway's RssAnon\n", d.reconnect.Round(time.Millisecond))
	fmt.Fprintln(w, "after the throughput rounds, before the outage. All processes share this machine's cores; kfake runs inside the harness.")
	fmt.Fprintln(w, "A stream's rate is what it took from the round's start until the forward log was empty again; its rounds have no")
	fmt.Fprintln(w, "subscribers, and it is compared with the messages/s the gateway without forwarding acknowledged.")
}

// profileForwarding takes a CPU profile of each forwarding gateway
// during one more round of its kind, into o.profile.
func profileForwarding(ctx context.Context, dir string, o options, targets []forwardTarget) error {
	if err := os.MkdirAll(o.profile, 0o755); err != nil {
		return err
	}
	for i, tg := range targets {
		if tg.fwd == nil || tg.fwd.pprof == "" {
			continue
		}
		name := fmt.Sprintf("%s/forward-%d.cpu.pprof", o.profile, i)
		cpu := make(chan error, 1)
		go func() {
			cpu <- fetch(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", tg.fwd.pprof, max(1, int(o.duration/time.Second))), name)
		}()
		var err error
		if tg.stream() {
			_, err = streamRound(ctx, dir, o, tg.fwd, tg.dest)
		} else {
			_, err = loadRound(ctx, dir, o, tg.pub, tg.sub, o.subscribers, o.duration, tg.proc)
		}
		if err == nil {
			err = <-cpu
		}
		if err != nil {
			return fmt.Errorf("profile %s: %w", tg.name, err)
		}
		fmt.Fprintf(os.Stderr, "profiled %s: %s\n", tg.name, name)
	}
	return nil
}

// baselineName is the baseline's setup beside this build's setup name.
func baselineName(name, label string) string {
	return strings.Replace(name, "gateway ", "gateway @"+label+" ", 1)
}

// printForwardComparison prints this build's figures against the
// baseline's (-baseline), measured in the same rounds: each setup's
// delivered messages/s and the drain's rate, as ratios.
func printForwardComparison(w io.Writer, o options, targets []forwardTarget, results map[string][]result, d, base drained) {
	fmt.Fprintf(w, "\nThis build ÷ %s, same rounds (median, per-round range):\n\n", o.label)
	fmt.Fprintln(w, "| setup | delivered msgs/s ratio | per round | goal |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, tg := range targets {
		if tg.fwd == nil || strings.Contains(tg.name, "@") {
			continue
		}
		other := baselineName(tg.name, o.label)
		if _, ok := results[other]; !ok {
			continue
		}
		fmt.Fprintf(w, "| %s | %s |\n", tg.name, ratioCells(results[tg.name], results[other], delivered, 1.0, false))
	}
	r := d.rate() / base.rate()
	fmt.Fprintf(w, "| drain of the backlog (%.0f vs %.0f msgs/s) | %.2f | one each | ≥ %.2f: %s |\n", d.rate(), base.rate(), r, drainGoalRatio, metOrNot(r >= drainGoalRatio))
}

// The drain's goal (issue 41): at least drainGoalRatio times the rate
// of build drainGoalBuild, measured in the same run (-baseline).
const (
	drainGoalRatio = 1.2
	drainGoalBuild = "0b30119"
)

// rate is the drain's messages per second.
func (d drained) rate() float64 { return float64(d.backlog) / d.drain.Seconds() }

// drainGoal is the goal table's row of the drain: judged only against
// build drainGoalBuild drained in the same run (base, labelled label;
// label "" when no baseline ran).
func drainGoal(d, base drained, label string) string {
	goal := fmt.Sprintf("drain of a %d-message backlog ≥ %.1f × build %s in the same run", d.backlog, drainGoalRatio, drainGoalBuild)
	got := fmt.Sprintf("%.0f msgs/s (%s)", d.rate(), d.drain.Round(time.Millisecond))
	switch {
	case label == "":
		return fmt.Sprintf("| %s | %s | not judged: run with -baseline %s |\n", goal, got, drainGoalBuild)
	case !strings.HasPrefix(label, drainGoalBuild):
		return fmt.Sprintf("| %s | %s; ÷ %s %.2f | not judged: the baseline is %s, not %s |\n", goal, got, label, d.rate()/base.rate(), label, drainGoalBuild)
	}
	r := d.rate() / base.rate()
	return fmt.Sprintf("| %s | %s; ÷ %s (%.0f msgs/s) %.2f | %s |\n", goal, got, label, base.rate(), r, metOrNot(r >= drainGoalRatio))
}
