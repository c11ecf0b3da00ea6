// Command harness is `make bench-e2e`: the gateway against plain mochi
// and Mosquitto under one load, side by side in one run.
//
// It builds the gateway, bench/plainmochi and bench/loadgen, starts on
// loopback ports the gateway (throttling on: devices pub-* have a quota
// they cannot reach, devices hot-* one message per hour), plain mochi and
// Mosquitto (config bench/mosquitto.conf), then runs loadgen, one
// process per round, against four targets in turn: the gateway with
// every message admitted, the gateway with about half refused (half the
// publishers are hot-*), plain mochi and Mosquitto; QoS 0 and QoS 1,
// interleaved, the order rotated every round. It prints the median, min
// and max of received and delivered messages/s and the ratios, and stops
// every process it started, by PID.
//
//	go run ./bench/harness -rounds 5 -duration 3s
//	go run ./bench/harness -profile DIR   # also CPU and allocation profiles of the gateway and plain mochi
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type options struct {
	rounds                  int
	duration                time.Duration
	publishers, subscribers int
	inflight                int
	profile                 string
	keep                    bool
	mode                    string
	// baseline is another build run beside this one (-baseline); label
	// names it in the tables once built.
	baseline, label string
}

// target is one broker configuration under test.
type target struct {
	name string
	addr string
	hot  int   // publishers named hot-*
	proc *proc // the server, for its CPU time
}

// result is loadgen's JSON line.
type result struct {
	Published   int64   `json:"published"`
	ReceivedPS  float64 `json:"received_per_s"`
	Delivered   int64   `json:"delivered"`
	DeliveredPS float64 `json:"delivered_per_s"`
	AckP50      float64 `json:"ack_p50_ms"`
	AckP99      float64 `json:"ack_p99_ms"`
	// CPU is the server's CPU time (user and system, all threads)
	// during the round, measured by the harness.
	CPU time.Duration `json:"-"`
	// DestCPU is the CPU time of a stream's server during a forwarding
	// round and its drain.
	DestCPU time.Duration `json:"-"`
}

func main() {
	if err := mainErr(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "harness:", err)
		os.Exit(1)
	}
}

func mainErr(args []string) error {
	var o options
	fs := flag.NewFlagSet("harness", flag.ContinueOnError)
	fs.IntVar(&o.rounds, "rounds", 5, "interleaved rounds per target and QoS")
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "publishing time of one round")
	fs.IntVar(&o.publishers, "publishers", 50, "publishing clients")
	fs.IntVar(&o.subscribers, "subscribers", 5, "subscribing clients")
	fs.IntVar(&o.inflight, "inflight", 32, "unacknowledged QoS 1 publishes per publisher")
	fs.StringVar(&o.profile, "profile", "", "write CPU and allocation profiles of the gateway under load to `dir`")
	fs.BoolVar(&o.keep, "keep", false, "keep the work directory (binaries, configs, server logs)")
	fs.StringVar(&o.baseline, "baseline", "", "e2e and forward modes: also run the gateway of `rev` (a commit of this repository, or a gateway binary's path) beside this one, in the same rounds, and give the ratios")
	fs.StringVar(&o.mode, "mode", "e2e", "e2e (gateway, plain mochi, Mosquitto), forward (make bench-forward), density (make bench-density) or feedback (make bench-feedback)")
	var do densityOptions
	fs.IntVar(&do.conns, "conns", 10_000, "density mode: idle connections per server")
	fs.StringVar(&do.targets, "density-targets", "gateway,mochi,mosquitto", "density mode: the servers measured, in order")
	fs.StringVar(&do.gwKeys, "gateway-mqtt", "", "density mode: more keys of the gateway's mqtt: section (`yaml` lines, e.g. \"max_pending_writes: 16\")")
	var fo forwardOptions
	fs.IntVar(&fo.backlog, "backlog", 1_000_000, "forward mode: messages in the backlog whose drain is timed")
	fs.StringVar(&fo.keys, "forward-keys", "", "forward mode: more keys of every forward: entry (`yaml`, e.g. \"max_inflight: 1000\")")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.rounds < 1 || o.duration <= 0 || o.publishers < 2 || o.subscribers < 1 {
		return errors.New("need rounds >= 1, duration > 0, publishers >= 2, subscribers >= 1")
	}
	if _, err := os.Stat("bench/mosquitto.conf"); err != nil {
		return fmt.Errorf("run from the repository root: %w", err)
	}
	mosquitto, err := findProgram("mosquitto")
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "bench-e2e-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Fprintln(os.Stderr, "harness: work directory", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	if err := build(dir, o.profile != ""); err != nil {
		return err
	}
	if o.baseline != "" {
		if o.mode != "e2e" && o.mode != "forward" {
			return fmt.Errorf("-baseline: only with -mode e2e or forward, not %q", o.mode)
		}
		if o.label, err = buildBaseline(dir, o.baseline, o.profile != ""); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "harness: baseline %s built\n", o.label)
	}
	if o.mode == "density" {
		do.profile = o.profile
		ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer cancel()
		return densityBench(ctx, dir, do, mosquitto)
	}

	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	// Stop the servers on ^C too: the deferred stops run once the
	// current round's loadgen has been cancelled.
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	switch o.mode {
	case "forward":
		return forwardBench(ctx, dir, o, fo, mosquitto)
	case "feedback":
		return feedbackBench(ctx, dir, o)
	case "e2e":
	default:
		return fmt.Errorf("-mode %q: want e2e, forward, density or feedback", o.mode)
	}

	gw, pprofAddr, err := startGateway(dir, o.profile != "")
	if gw != nil {
		procs = append(procs, gw.p)
	}
	if err != nil {
		return err
	}
	pmArgs := []string{"-addr", "127.0.0.1:0"}
	var pmPprof string
	if o.profile != "" {
		if pmPprof, err = freePort(); err != nil {
			return err
		}
		pmArgs = append(pmArgs, "-pprof", pmPprof)
	}
	pm, err := start(dir, "plainmochi", nil, dir+"/plainmochi", pmArgs...)
	if err != nil {
		return err
	}
	procs = append(procs, pm)
	pmAddr, err := pm.waitLog(regexp.MustCompile(`^listening (\S+)`), 10*time.Second)
	if err != nil {
		return err
	}
	mqAddr, mq, err := startMosquitto(dir, mosquitto)
	if mq != nil {
		procs = append(procs, mq)
	}
	if err != nil {
		return err
	}

	targets := []target{
		{name: "gateway, all admitted", addr: gw.addr, proc: gw.p},
		{name: "gateway, ~half refused", addr: gw.addr, hot: o.publishers / 2, proc: gw.p},
		{name: "plain mochi", addr: pmAddr, proc: pm},
		{name: "mosquitto", addr: mqAddr, proc: mq},
	}
	if o.label != "" {
		base, _, err := startGatewayOf(dir, "gateway-baseline", baselineBin(dir), false)
		if base != nil {
			procs = append(procs, base.p)
		}
		if err != nil {
			return err
		}
		targets = append(targets,
			target{name: "gateway @" + o.label + ", all admitted", addr: base.addr, proc: base.p},
			target{name: "gateway @" + o.label + ", ~half refused", addr: base.addr, hot: o.publishers / 2, proc: base.p})
	}
	results := map[string][]result{} // by key(target, qos)
	for r := range o.rounds {
		for _, qos := range []int{0, 1} {
			for i := range targets {
				tg := targets[(i+r)%len(targets)]
				res, err := load(ctx, dir, o, tg, qos)
				if err != nil {
					return err
				}
				fmt.Fprintf(os.Stderr, "round %d qos %d %-24s received %8.0f/s delivered %8.0f/s server CPU %5.1f µs/msg\n",
					r+1, qos, tg.name, res.ReceivedPS, res.DeliveredPS, cpuPerMsg(res))
				results[key(tg.name, qos)] = append(results[key(tg.name, qos)], res)
			}
		}
	}
	printTable(os.Stdout, o, targets, results)
	if o.profile != "" {
		return profile(ctx, dir, o, targets[:3], []string{pprofAddr, pprofAddr, pmPprof})
	}
	return nil
}

func key(name string, qos int) string { return name + "/" + strconv.Itoa(qos) }

// build compiles the three programs into dir; with pprof, the gateway
// also serves net/http/pprof (bench/harness/pprof).
func build(dir string, pprof bool) error {
	gw, err := gatewayBuildArgs(dir, ".", dir+"/gateway", pprof)
	if err != nil {
		return err
	}
	for _, args := range [][]string{
		gw,
		{"build", "-o", dir + "/plainmochi", "./bench/plainmochi"},
		{"build", "-o", dir + "/loadgen", "./bench/loadgen"},
	} {
		if out, err := exec.Command(goCommand(), args...).CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

type gateway struct {
	p    *proc
	addr string
}

// gatewayConfig throttles every device: pub-* can send a billion
// messages a second, hot-* one an hour (the first, in the first round).
const gatewayConfig = `mqtt: {tcp: "127.0.0.1:0", consumers: {client_ids: ["sub-*"]}}
admin: {addr: "127.0.0.1:0"}
data_dir: %q
limits:
  default: {limit: 1000000000, window: 1s, policy: drop}
  rules:
    - match: {client_id: "hot-*"}
      quota: {limit: 1, window: 1h, policy: drop}
`

func startGateway(dir string, pprof bool) (*gateway, string, error) {
	return startGatewayOf(dir, "gateway", dir+"/gateway", pprof)
}

// startGatewayOf starts the gateway binary bin as name, with its
// configuration and data under dir/name-*.
func startGatewayOf(dir, name, bin string, pprof bool) (*gateway, string, error) {
	conf := dir + "/" + name + ".yaml"
	if err := os.WriteFile(conf, fmt.Appendf(nil, gatewayConfig, dir+"/"+name+"-data"), 0o644); err != nil {
		return nil, "", err
	}
	var env []string
	var pprofAddr string
	if pprof {
		var err error
		if pprofAddr, err = freePort(); err != nil {
			return nil, "", err
		}
		env = append(env, "BENCH_PPROF_ADDR="+pprofAddr)
	}
	p, err := start(dir, name, env, bin, "serve", "--config", conf)
	if err != nil {
		return nil, "", err
	}
	g := &gateway{p: p}
	g.addr, err = p.waitLog(regexp.MustCompile(`msg="mqtt listening" addr=(\S+)`), 15*time.Second)
	return g, pprofAddr, err
}

func startMosquitto(dir, mosquitto string) (string, *proc, error) {
	addr, _, p, err := startMosquittoConf(dir, mosquitto, "mosquitto", "")
	return addr, p, err
}

// startMosquittoConf starts a Mosquitto named name on a free port with
// bench/mosquitto.conf plus extra lines (a bridge), and returns its
// address and configuration file.
func startMosquittoConf(dir, mosquitto, name, extra string) (string, string, *proc, error) {
	addr, err := freePort()
	if err != nil {
		return "", "", nil, err
	}
	tmpl, err := os.ReadFile("bench/mosquitto.conf")
	if err != nil {
		return "", "", nil, err
	}
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	conf := dir + "/" + name + ".conf"
	if err := os.WriteFile(conf, []byte(strings.ReplaceAll(string(tmpl), "@PORT@", port)+extra), 0o644); err != nil {
		return "", "", nil, err
	}
	p, err := start(dir, name, nil, mosquitto, "-c", conf)
	if err != nil {
		return "", "", nil, err
	}
	return addr, conf, p, waitDial(addr, 10*time.Second)
}

// load runs one loadgen round against tg.
func load(ctx context.Context, dir string, o options, tg target, qos int) (result, error) {
	res, err := loadgen(ctx, dir, o, tg.proc, "-addr", tg.addr, "-qos", strconv.Itoa(qos),
		"-subscribers", strconv.Itoa(o.subscribers), "-hot", strconv.Itoa(tg.hot), "-duration", o.duration.String())
	if err != nil {
		return result{}, fmt.Errorf("%s, qos %d: %w", tg.name, qos, err)
	}
	return res, nil
}

// loadRound runs one QoS 1 loadgen round: publishers on pub,
// subscribers on sub.
func loadRound(ctx context.Context, dir string, o options, pub, sub string, subscribers int, d time.Duration, server *proc) (result, error) {
	return loadgen(ctx, dir, o, server, "-addr", pub, "-sub-addr", sub, "-qos", "1",
		"-subscribers", strconv.Itoa(subscribers), "-duration", d.String())
}

// loadgen runs loadgen with args and o's publishers and window, and
// measures server's CPU time during the round.
func loadgen(ctx context.Context, dir string, o options, server *proc, args ...string) (result, error) {
	d := o.duration
	for i, a := range args {
		if a == "-duration" {
			d, _ = time.ParseDuration(args[i+1])
		}
	}
	// The round may take its duration plus draining; bounded all the same.
	ctx, cancel := context.WithTimeout(ctx, d+90*time.Second)
	defer cancel()
	cpu0, err := server.cpu()
	if err != nil {
		return result{}, err
	}
	out, err := run(ctx, dir+"/loadgen", append(args, "-publishers", strconv.Itoa(o.publishers), "-inflight", strconv.Itoa(o.inflight))...)
	if err != nil {
		return result{}, err
	}
	var res result
	if err := json.Unmarshal(out, &res); err != nil {
		return result{}, fmt.Errorf("loadgen printed %q: %w", out, err)
	}
	cpu1, err := server.cpu()
	res.CPU = cpu1 - cpu0
	return res, err
}
