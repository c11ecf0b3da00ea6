package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/flagvalue"
	"github.com/devicegate/devicegate/persist"
	"github.com/devicegate/devicegate/server"
)

// serveFlags are the serve command's flags. Each setting flag overrides
// one config key, and only when given on the command line.
type serveFlags struct {
	config           string
	mqttAddr         string
	adminAddr        string
	dataDir          string
	snapshotInterval flagvalue.Duration
	restoreDelay     flagvalue.Duration
	limit            flagvalue.Int
	window           flagvalue.Duration
	policy           string
	buckets          flagvalue.Int
	logLevel         string
}

// flagKeys maps each setting flag to the config key it overrides, so
// that a bad value is reported under the flag the operator typed.
var flagKeys = map[string]string{
	"mqtt-addr":           "mqtt.tcp",
	"admin-addr":          "admin.addr",
	"data-dir":            "data_dir",
	"snapshot-interval":   "persist.snapshot_interval",
	"defer-restore-delay": "limits.defer.restore_delay",
	"limit":               "limits.default.limit",
	"window":              "limits.default.window",
	"policy":              "limits.default.policy",
	"buckets":             "limits.buckets",
	"log-level":           "log.level",
}

func newServeFlags(f *serveFlags) *flag.FlagSet {
	d := config.Default()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned; help goes to stdout
	fs.StringVar(&f.config, "config", "", "read settings from the YAML `file` (default: none, built-in defaults)")
	fs.StringVar(&f.mqttAddr, "mqtt-addr", d.MQTT.TCP, fmt.Sprintf("MQTT TCP listen `address`; port 0 picks a free port (mqtt.tcp, default %q)", d.MQTT.TCP))
	fs.StringVar(&f.adminAddr, "admin-addr", d.Admin.Addr, fmt.Sprintf("admin API and /metrics listen `address`; port 0 picks a free port (admin.addr, default %q)", d.Admin.Addr))
	fs.StringVar(&f.dataDir, "data-dir", d.DataDir, fmt.Sprintf("`directory` of the state file %s, created if missing (data_dir, default %q)", persist.FileName, d.DataDir))
	fs.Var(&f.restoreDelay, "defer-restore-delay", fmt.Sprintf("after a start, hold messages deferred before it for `duration`, so consumers can reconnect first (limits.defer.restore_delay, default %s)", d.Limits.Defer.RestoreDelay))
	fs.Var(&f.snapshotInterval, "snapshot-interval", fmt.Sprintf("write changed windows every `duration`; a crash loses at most about this long of admissions (persist.snapshot_interval, default %s)", d.Persist.SnapshotInterval))
	fs.Var(&f.limit, "limit", fmt.Sprintf("default quota: `N` messages per window (limits.default.limit, default %d)", d.Limits.Default.Limit))
	fs.Var(&f.window, "window", fmt.Sprintf("default quota `duration` such as 10s (limits.default.window, default %s)", d.Limits.Default.Window))
	fs.StringVar(&f.policy, "policy", d.Limits.Default.Policy.String(), fmt.Sprintf("default quota `policy` over the limit: drop, defer or disconnect (limits.default.policy, default %s)", d.Limits.Default.Policy))
	fs.Var(&f.buckets, "buckets", fmt.Sprintf("`N` buckets per window, 1..%d (limits.buckets, default %d)", devicelimit.MaxBuckets, d.Limits.Buckets))
	fs.StringVar(&f.logLevel, "log-level", config.LevelName(d.Log.Level), fmt.Sprintf("lowest log `level`: debug, info, warn or error (log.level, default %s)", config.LevelName(d.Log.Level)))
	return fs
}

func printServeUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `Usage: gateway serve [flags]

Runs the gateway until SIGINT or SIGTERM; SIGHUP reloads the --config
file (docs/deployment.md, "Reloading"). Settings come from the built-in
defaults, then the --config file, then the flags given. --limit, --window
and --policy set the default quota; rules in the file keep their own.
Device windows and quota overrides are kept in --data-dir and survive
restarts; one gateway at a time may use a data directory. The admin API
and /metrics listen on --admin-addr; the API's bearer token is
admin.token, else $GATEWAY_ADMIN_TOKEN, else the file admin.token in
--data-dir, created on first start. With cluster.redis in the --config
file, several gateways share device windows and quota overrides in
Redis (docs/operations.md: "Running several gateways").

Flags:
`)
	printFlags(w, fs)
}

// serveConfig builds the configuration: Default, then the file named by
// --config, then the flags that were given, then Validate.
func serveConfig(args []string, stdout io.Writer) (config.Config, error) {
	var f serveFlags
	fs := newServeFlags(&f)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printServeUsage(stdout, fs)
			return config.Config{}, err
		}
		return config.Config{}, usagef("serve: %v (run \"gateway help serve\")", err)
	}
	if fs.NArg() > 0 {
		return config.Config{}, usagef("serve: unexpected argument %q (run \"gateway help serve\")", fs.Arg(0))
	}

	cfg := config.Default()
	if f.config != "" {
		var err error
		if cfg, err = config.ReadFile(f.config); err != nil {
			return config.Config{}, err
		}
	}

	set := make(map[string]bool)
	var flagErrs []error // a name no setting has: the flag is to blame
	named := func(flag, s string, parse func(string) error) {
		if err := parse(s); err != nil {
			flagErrs = append(flagErrs, fmt.Errorf("--%s: %w", flag, err))
		}
	}
	fs.Visit(func(fl *flag.Flag) {
		set[fl.Name] = true
		switch fl.Name {
		case "mqtt-addr":
			cfg.MQTT.TCP = f.mqttAddr
		case "admin-addr":
			cfg.Admin.Addr = f.adminAddr
		case "data-dir":
			cfg.DataDir = f.dataDir
		case "snapshot-interval":
			cfg.Persist.SnapshotInterval = config.Duration(f.snapshotInterval.V)
		case "defer-restore-delay":
			cfg.Limits.Defer.RestoreDelay = config.Duration(f.restoreDelay.V)
		case "limit":
			cfg.Limits.Default.Limit = f.limit.V
			cfg.Limits.Default.OneWindow()
		case "window":
			cfg.Limits.Default.Window = config.Duration(f.window.V)
			cfg.Limits.Default.OneWindow()
		case "policy":
			named("policy", f.policy, func(s string) (err error) { cfg.Limits.Default.Policy, err = config.ParsePolicy(s); return err })
		case "buckets":
			cfg.Limits.Buckets = f.buckets.V
		case "log-level":
			named("log-level", f.logLevel, func(s string) (err error) { cfg.Log.Level, err = config.ParseLevel(s); return err })
		}
	})

	errs := flagErrs
	if err := cfg.Validate(); err != nil {
		errs = append(errs, blameFlags(err, set))
	}
	if len(errs) > 0 {
		source := "invalid settings"
		if f.config != "" {
			source += " (config " + f.config + ")"
		}
		return config.Config{}, config.Prefix(source, errors.Join(errs...))
	}
	return cfg, nil
}

// blameFlags names the flags among set in the problems of err.
func blameFlags(err error, set map[string]bool) error {
	byKey := make(map[string]string)
	for name, key := range flagKeys {
		if set[name] {
			byKey[key] = name
		}
	}
	return config.NameFlags(err, byKey)
}

// serve runs the gateway until ctx is cancelled, then shuts it down
// within server.ShutdownTimeout.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := serveConfig(args, stdout)
	if err != nil {
		return err
	}
	level, err := cfg.LogLevel() // Validate has checked it
	if err != nil {
		return err
	}
	lv := new(slog.LevelVar)
	lv.Set(level)
	log := slog.New(cfg.Log.Handler(stderr, lv))
	// A reload reads the file again, under the same flags.
	load := func() (config.Config, error) { return serveConfig(args, io.Discard) }
	err = server.Run(ctx, cfg, server.Deps{Logger: log, Level: lv, Version: releaseName(), Load: load})
	if err != nil && cfg.Log.Format == "json" {
		// A log collector reading JSON lines gets the failure as one.
		log.Error("gateway failed", "error", err)
		return reportedError{err}
	}
	return err
}
