package fleet

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/flagvalue"
	"github.com/devicegate/devicegate/simulator"
)

// simulateFlags are the simulate command's flags.
type simulateFlags struct {
	addr        string
	devices     flagvalue.Int
	idPattern   string
	rate        rateValue
	pattern     string
	burst       flagvalue.Int
	period      flagvalue.Duration
	seed        uint64
	qos         flagvalue.Int
	protocol    protocolValue
	payloadSize flagvalue.Int
	topic       string
	duration    flagvalue.Duration
	rampUp      floatValue
	limit       flagvalue.Int
	window      flagvalue.Duration
	policy      string
	tolerance   flagvalue.Duration
	jsonFile    string
	reportFile  string
	drain       flagvalue.Duration
	mix         string
	windows     string
	topicClass  string
	group       string
	flood       string
	client      string
	stormAt     flagvalue.Duration
	restartAt   flagvalue.Duration
	target      targetFlags
	auth        simAuthFlags
}

func newSimulateFlags(f *simulateFlags) *flag.FlagSet {
	f.devices.V = 10
	f.rate.v = 1
	f.protocol.v = 5
	f.qos.V = 1
	f.duration.V = 10 * time.Second
	f.limit.V = 100
	f.window.V = 10 * time.Second
	f.tolerance.V = 50 * time.Millisecond
	f.drain.V = 2 * time.Second
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned; help goes to stdout
	fs.StringVar(&f.addr, "addr", "127.0.0.1:1883", "MQTT `address` of the gateway; loopback only (127.0.0.0/8, ::1, localhost)")
	fs.Var(&f.devices, "devices", "simulate `N` devices (default 10)")
	fs.StringVar(&f.idPattern, "id-pattern", "dev-%05d", "client ID of device i, a Printf `pattern`")
	fs.Var(&f.rate, "rate", `messages per device per second, as "5/s", "300/m", "2/500ms" or a plain `+"`rate`"+` per second (default 1/s)`)
	fs.StringVar(&f.pattern, "pattern", simulator.PatternSteady, "publishing `pattern`: steady, burst or poisson")
	fs.Var(&f.burst, "burst", "burst pattern: `N` messages back to back every --period")
	fs.Var(&f.period, "period", "burst pattern: a burst every `duration`")
	fs.Uint64Var(&f.seed, "seed", 0, "poisson pattern: the random `seed` of the gaps (the same seed, the same gaps)")
	fs.Var(&f.qos, "qos", "QoS of device publishes, 0, 1 or 2; at QoS 0 there is no PUBACK, so no verdict per message (default 1)")
	fs.Var(&f.protocol, "protocol", `MQTT `+"`version`"+`: 5, or 4 (also "3.1.1"); 3.1.1 acks carry no verdict (default 5)`)
	fs.Var(&f.payloadSize, "payload-size", "pad payloads to `N` bytes (default 0: the header only)")
	fs.StringVar(&f.topic, "topic", "", "device topic `pattern`; %s is the client ID (default devices/%s/sim-RUNID, RUNID random per run)")
	fs.Var(&f.duration, "duration", "publish for `duration` (default 10s)")
	fs.Var(&f.rampUp, "ramp-up", "start `N` connections per second; 0 connects all at once (default 0)")
	fs.Var(&f.limit, "limit", "quota the run is judged against: `N` messages per --window (default 100)")
	fs.Var(&f.window, "window", "quota window `duration` the run is judged against (default 10s)")
	fs.StringVar(&f.windows, "windows", "", `quota of several `+"`windows`"+` the run is judged against, instead of --limit/--window: N/DURATION (messages) or SIZE/DURATION (payload bytes, SIZE with a unit), comma-separated, e.g. "10/1s,2KiB/10s"`)
	fs.StringVar(&f.topicClass, "topic-class", "", `with --embedded or --spawn: send every EVERY-th message of each device in the gateway's topic class NAME (limits.classes), judged by the class's quota; "`+"`NAME:EVERY`"+`,...", e.g. "alarms:10"`)
	fs.StringVar(&f.group, "group", "", `the gateway's group (a tenant) all devices are in, judged together against its windows too: "`+"`NAME:WINDOWS`"+`", WINDOWS as --windows, e.g. "acme:100/10s"`)
	fs.StringVar(&f.client, "client", "paho", `the devices' MQTT `+"`client`"+`: paho (paho.golang; paho.mqtt.golang for --protocol 4), lean (MQTT 5 on mochi's packet codec, no goroutine of its own: for runs of many devices), adaptive (lean, pacing itself by the gateway's RateLimit feedback), or a mix such as "50%:lean,50%:adaptive"`)
	fs.StringVar(&f.flood, "flood", "", `the first N devices flood at RATE messages per second instead of --rate: "`+"`N:RATE`"+`", e.g. "1:200"`)
	fs.StringVar(&f.policy, "policy", "drop", "quota `policy` the gateway applies: drop, defer or disconnect")
	fs.Var(&f.tolerance, "tolerance", "slack in `duration` allowed to the checker's window edges (default 50ms)")
	fs.StringVar(&f.jsonFile, "json", "", `write the whole report as JSON to `+"`file`"+`; "-" for stdout`)
	fs.Var(&f.drain, "drain", "after publishing, wait up to `duration` for acked messages still on their way (default 2s; > 0)")
	fs.StringVar(&f.reportFile, "report", "", "write a self-contained HTML report with charts to `file`")
	fs.StringVar(&f.mix, "mix", "", `quota `+"`mix`"+` across the fleet, "SHARE%:LIMIT/WINDOW[:POLICY],...", e.g. "70%:50/10s:drop,30%:5/1s:defer"; devices not on the default quota get overrides (embedded, spawned, or --addr with --admin-addr)`)
	fs.BoolVar(&f.target.embedded, "embedded", false, "run the gateway in this process on a free loopback port (temporary data directory unless --data-dir)")
	fs.BoolVar(&f.target.spawn, "spawn", false, "start `gateway serve` as a child process on a free loopback port (temporary data directory unless --data-dir)")
	fs.StringVar(&f.target.gatewayBin, "gateway-bin", "", "with --spawn: the gateway `binary` (default: this one)")
	fs.StringVar(&f.target.dataDir, "data-dir", "", "with --embedded or --spawn: the gateway's data `directory` (default: a temporary one, removed after)")
	fs.StringVar(&f.target.config, "config", "", "with --embedded or --spawn: the gateway's YAML config `file`; --limit, --window and --policy override its default quota only when given")
	fs.Var(&f.target.snapshotInterval, "snapshot-interval", "with --embedded or --spawn: the gateway's snapshot `duration`, also the crash bound for --restart kill (default 1s)")
	fs.Var(&f.stormAt, "storm-at", "at `offset` into the run every device drops its connection and reconnects at once")
	fs.Var(&f.restartAt, "restart-at", "at `offset` into the run restart the gateway (--embedded or --spawn)")
	fs.StringVar(&f.target.restart, "restart", "sigterm", "how --restart-at restarts: sigterm (graceful), or kill (kill -9, --spawn only)")
	fs.Var(&f.target.clockStep, "clock-step", "with --embedded and --restart-at: the restarted gateway's wall clock is moved by `duration` (negative: backwards)")
	fs.StringVar(&f.target.upstream, "upstream", "", `count arrivals at an upstream broker the gateway forwards to: "embedded" (a broker in this process) or its loopback `+"`address`"+`; a gateway the simulator starts forwards everything to it`)
	fs.Var(&f.target.outageAt, "upstream-outage-at", "with --upstream and --embedded or --spawn: at `offset` into the run cut the gateway's link to the upstream")
	fs.Var(&f.target.outageFor, "upstream-outage-for", "with --upstream-outage-at: how long the link stays cut (`duration`)")
	fs.StringVar(&f.target.adminAddr, "admin-addr", "", "with --addr and --mix: the gateway's admin API `address`, to set the mix's overrides")
	fs.StringVar(&f.target.adminToken, "admin-token", "", "with --admin-addr: the admin API bearer `token` (default $GATEWAY_ADMIN_TOKEN)")
	f.auth.register(fs)
	return fs
}

// SimulateFlagSet returns the simulate command's flags, for its help.
func SimulateFlagSet() *flag.FlagSet { return newSimulateFlags(new(simulateFlags)) }

// ParseSimulate reads the simulate command's flags (args without the
// command's name) into a Simulation. It returns flag.ErrHelp when args
// ask for help, and a *UsageError naming the flag for a bad one.
func ParseSimulate(args []string) (*Simulation, error) {
	f := new(simulateFlags)
	fs := newSimulateFlags(f)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usagef("simulate: %v (run \"gateway help simulate\")", err)
	}
	if fs.NArg() > 0 {
		return nil, usagef("simulate: unexpected argument %q (run \"gateway help simulate\")", fs.Arg(0))
	}
	bad := func(name, why string, v any) (*Simulation, error) {
		return nil, usagef("simulate: --%s: %s (got %v)", name, why, v)
	}
	policy, err := devicelimit.ParsePolicy(f.policy)
	if err != nil {
		return bad("policy", "must be drop, defer or disconnect", strconv.Quote(f.policy))
	}
	switch {
	case f.devices.V <= 0:
		return bad("devices", "must be > 0", f.devices.V)
	case f.qos.V < 0 || f.qos.V > 2:
		return bad("qos", "must be 0, 1 or 2", f.qos.V)
	case f.payloadSize.V < 0:
		return bad("payload-size", "must be >= 0", f.payloadSize.V)
	case f.duration.V <= 0:
		return bad("duration", "must be > 0", f.duration.V)
	case f.limit.V <= 0:
		return bad("limit", "must be > 0", f.limit.V)
	case f.window.V <= 0:
		return bad("window", "must be > 0", f.window.V)
	case f.drain.V <= 0:
		return bad("drain", "must be > 0", f.drain.V)
	case f.tolerance.V < 0:
		return bad("tolerance", "must be >= 0", f.tolerance.V)
	case f.rampUp.v < 0:
		return bad("ramp-up", "must be >= 0", f.rampUp.v)
	case f.burst.V < 0:
		return bad("burst", "must be > 0", f.burst.V)
	case f.period.V < 0:
		return bad("period", "must be > 0", f.period.V)
	}
	cfg := simulator.Config{
		Addr:        f.addr,
		Devices:     f.devices.V,
		IDPattern:   f.idPattern,
		Rate:        f.rate.v,
		Pattern:     f.pattern,
		Seed:        f.seed,
		Burst:       f.burst.V,
		Period:      f.period.V,
		QoS:         byte(f.qos.V),
		Protocol:    f.protocol.v,
		Client:      f.client,
		PayloadSize: f.payloadSize.V,
		Topic:       f.topic,
		Duration:    f.duration.V,
		RampUp:      f.rampUp.v,
		Quota:       devicelimit.Quota{Limit: f.limit.V, Window: f.window.V, Policy: policy},
		Tolerance:   f.tolerance.V,
		Drain:       f.drain.V,
	}
	if cfg.Tolerance == 0 {
		// The simulator treats 0 as "default"; a tiny slack is the
		// nearest thing to none it can express.
		cfg.Tolerance = time.Nanosecond
	}
	set := make(map[string]bool)
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if f.windows != "" {
		ls, err := devicelimit.ParseLimits(f.windows, ",")
		if err == nil {
			err = devicelimit.ValidateLimits(ls, 1)
		}
		if err != nil {
			return bad("windows", err.Error(), strconv.Quote(f.windows))
		}
		cfg.Quota = devicelimit.WithWindows(policy, ls...)
	}
	if cfg.Mix, err = simulator.ParseMix(f.mix, policy); err != nil {
		return bad("mix", err.Error(), strconv.Quote(f.mix))
	}
	if f.group != "" {
		name, windows, ok := strings.Cut(f.group, ":")
		ls, err := devicelimit.ParseLimits(windows, ",")
		if err == nil {
			err = devicelimit.ValidateLimits(ls, 1)
		}
		if !ok || name == "" || err != nil {
			return bad("group", fmt.Sprintf("want NAME:WINDOWS such as acme:100/10s (%v)", err), strconv.Quote(f.group))
		}
		cfg.Group = &simulator.Group{Name: name, Quota: devicelimit.WithWindows(devicelimit.PolicyDrop, ls...)}
	}
	if f.flood != "" {
		n, rate, ok := strings.Cut(f.flood, ":")
		cfg.Flood, err = strconv.Atoi(n)
		if err == nil {
			cfg.FloodRate, err = strconv.ParseFloat(rate, 64)
		}
		if !ok || err != nil || cfg.Flood < 1 || !(cfg.FloodRate > 0) {
			return bad("flood", "want N:RATE with N >= 1 devices and RATE > 0 messages per second, such as 1:200", strconv.Quote(f.flood))
		}
	}
	if err := f.checkTarget(set); err != nil {
		return nil, err
	}
	if err := f.auth.apply(&cfg, set, f.target.embedded || f.target.spawn); err != nil {
		return nil, err
	}
	cfg.StormAt, cfg.RestartAt = f.stormAt.V, f.restartAt.V
	return &Simulation{Config: cfg, JSON: f.jsonFile, Report: f.reportFile, Own: f.target.embedded || f.target.spawn, f: f, set: set}, nil
}

// simFieldFlags maps simulator.Config field names, as its validation
// errors spell them, to the flags that set them.
var simFieldFlags = map[string]string{
	"addr": "addr", "devices": "devices", "id_pattern": "id-pattern", "topic": "topic",
	"duration": "duration", "qos": "qos", "protocol": "protocol", "ramp_up": "ramp-up",
	"quota": "limit/--window", "rate": "rate", "burst": "burst", "period": "period",
	"pattern": "pattern", "payload_size": "payload-size", "drain": "drain", "mix": "mix",
	"topic_classes": "topic-class", "group": "group", "flood": "flood", "flood_rate": "flood", "client": "client",
}

// blameSimFlags turns a simulator config error into a usage error that
// names the flag.
func blameSimFlags(err error) error {
	if !errors.Is(err, simulator.ErrInvalidConfig) && !errors.Is(err, simulator.ErrNotLoopback) {
		return fmt.Errorf("simulate: %w", err)
	}
	msg := err.Error()
	for _, prefix := range []string{simulator.ErrInvalidConfig.Error() + ": ", simulator.ErrNotLoopback.Error() + ": "} {
		rest, ok := strings.CutPrefix(msg, prefix)
		if !ok {
			continue
		}
		field, why, _ := strings.Cut(rest, ":")
		field, _, _ = strings.Cut(field, " ")
		if name, ok := simFieldFlags[field]; ok {
			if errors.Is(err, simulator.ErrNotLoopback) {
				why = " " + simulator.ErrNotLoopback.Error() + ";" + why
			}
			return usagef("simulate: --%s:%s", name, why)
		}
	}
	return &UsageError{fmt.Errorf("simulate: %w", err)}
}

// rateValue is a per-second rate: "5/s", "300/m", "1/h", "2/500ms", or a
// plain number meaning per second.
type rateValue struct{ v float64 }

func (r *rateValue) String() string { return strconv.FormatFloat(r.v, 'g', -1, 64) + "/s" }
func (r *rateValue) Set(s string) error {
	const want = `must be a rate > 0 like "5/s", "300/m", "2/500ms" or "5"`
	num, per, hasPer := strings.Cut(strings.TrimSpace(s), "/")
	n, err := strconv.ParseFloat(num, 64)
	if err != nil || !(n > 0) || math.IsInf(n, 0) {
		return errors.New(want)
	}
	d := time.Second
	if hasPer {
		switch per {
		case "s":
		case "m":
			d = time.Minute
		case "h":
			d = time.Hour
		default:
			if d, err = time.ParseDuration(per); err != nil || d <= 0 {
				return errors.New(want)
			}
		}
	}
	r.v = n / d.Seconds()
	return nil
}

// protocolValue is an MQTT protocol level: 4 (also "3.1.1") or 5 (also
// "5.0").
type protocolValue struct{ v int }

func (p *protocolValue) String() string { return strconv.Itoa(p.v) }
func (p *protocolValue) Set(s string) error {
	switch s {
	case "4", "3.1.1":
		p.v = 4
	case "5", "5.0":
		p.v = 5
	default:
		return errors.New(`must be 4 (or "3.1.1") or 5`)
	}
	return nil
}

// floatValue is a float flag whose parse errors read like the others'.
type floatValue struct{ v float64 }

func (f *floatValue) String() string { return strconv.FormatFloat(f.v, 'g', -1, 64) }
func (f *floatValue) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return errors.New("must be a number")
	}
	f.v = v
	return nil
}
