package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/devicegate/devicegate/admin"
	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/flagvalue"
	"github.com/devicegate/devicegate/server"
	"github.com/devicegate/devicegate/simulator"
)

// simTarget is the gateway a simulation runs against.
type simTarget interface {
	// mqttAddr is where devices connect.
	mqttAddr() string
	// setQuota sets an override for one device.
	setQuota(ctx context.Context, device string, q devicelimit.Quota) error
	// restart stops the gateway and starts it again on the same
	// address and data directory; nil when it cannot be restarted.
	restarter() func(ctx context.Context) error
	// close stops a gateway the simulator started.
	close(ctx context.Context) error
}

// targetFlags are the simulate flags that choose and shape the target.
type targetFlags struct {
	embedded         bool
	spawn            bool
	gatewayBin       string
	dataDir          string
	config           string
	snapshotInterval flagvalue.Duration
	restart          string
	clockStep        flagvalue.Duration
	adminAddr        string
	adminToken       string
	// upstream is --upstream (see upstream.go), outageAt and
	// outageFor the link's outage; forward, when set, is added to the
	// started gateway's configuration.
	upstream            string
	outageAt, outageFor flagvalue.Duration
	forward             *config.Forward
}

// gatewayConfig is the configuration of a gateway the simulator starts,
// built as a typed value (never as flag strings): the --config file or
// the defaults, loopback listeners (mqttAddr; the admin API on a free
// port), the data directory, and the quota settings the user gave (set
// names them; without a config file the flags' defaults are the quota).
// A spawned gateway logs at info: it is seen to listen by its info
// lines, which a config file's log.level warn would silence.
func (f *simulateFlags) gatewayConfig(dataDir, mqttAddr string, set map[string]bool) (config.Config, error) {
	cfg := config.Default()
	if f.target.config != "" {
		var err error
		if cfg, err = config.ReadFile(f.target.config); err != nil {
			return config.Config{}, err
		}
	}
	cfg.MQTT.TCP, cfg.Admin.Addr, cfg.DataDir = mqttAddr, "127.0.0.1:0", dataDir
	if f.target.forward != nil {
		cfg.Forward = append(cfg.Forward, *f.target.forward)
	}
	// The simulator's subscriber sees what many devices publish: a
	// backend consumer (docs/operations.md, Sizing), not a slow subscriber that
	// loses messages beyond a 64-message queue.
	cfg.MQTT.Consumers.ClientIDs = append(cfg.MQTT.Consumers.ClientIDs, f.auth.subscriberIDs()...)
	if f.target.spawn {
		cfg.Log.Level = slog.LevelInfo
	}
	given := map[string]bool{"snapshot-interval": set["snapshot-interval"], "windows": set["windows"]}
	if given["snapshot-interval"] {
		cfg.Persist.SnapshotInterval = config.Duration(f.target.snapshotInterval.V)
	}
	for _, name := range []string{"limit", "window", "policy"} {
		given[name] = (f.target.config == "" || set[name]) && !set["windows"]
	}
	if set["windows"] {
		// Checked when the flags were read.
		ls, _ := devicelimit.ParseLimits(f.windows, ",")
		cfg.Limits.Default.Limit, cfg.Limits.Default.Window, cfg.Limits.Default.Windows = 0, 0, quotaWindows(ls)
		given["policy"] = f.target.config == "" || set["policy"]
	}
	if given["limit"] {
		cfg.Limits.Default.Limit = f.limit.V
	}
	if given["window"] {
		cfg.Limits.Default.Window = config.Duration(f.window.V)
	}
	var errs []error
	if given["policy"] {
		p, err := config.ParsePolicy(f.policy)
		if err != nil {
			errs = append(errs, fmt.Errorf("--policy: %w", err))
		}
		cfg.Limits.Default.Policy = p
	}
	if err := cfg.Validate(); err != nil {
		errs = append(errs, config.NameFlags(err, flagKeys(given)))
	}
	if len(errs) > 0 {
		source := "invalid settings"
		if f.target.config != "" {
			source += " (config " + f.target.config + ")"
		}
		return config.Config{}, config.Prefix(source, errors.Join(errs...))
	}
	return cfg, nil
}

// quotaWindows returns ls as a configuration's quota windows.
func quotaWindows(ls []devicelimit.Limit) []config.QuotaWindow {
	out := make([]config.QuotaWindow, 0, len(ls))
	for _, l := range ls {
		w := config.QuotaWindow{Window: config.Duration(l.Window)}
		if l.Unit == devicelimit.Bytes {
			w.Bytes = config.Size(l.N)
		} else {
			w.Messages = l.N
		}
		out = append(out, w)
	}
	return out
}

// flagKeys maps the config keys of the given flags to their names.
func flagKeys(given map[string]bool) map[string]string {
	keys := map[string]string{"snapshot-interval": "persist.snapshot_interval", "limit": "limits.default.limit",
		"window": "limits.default.window", "policy": "limits.default.policy", "windows": "limits.default.windows"}
	byKey := make(map[string]string)
	for name, key := range keys {
		if given[name] {
			byKey[key] = name
		}
	}
	return byKey
}

// writeConfigFile writes cfg as YAML to gateway.yaml in dir, readable
// by its owner only (it may hold the admin token or the Redis password),
// for a spawned gateway's --config.
func writeConfigFile(dir string, cfg config.Config) (string, error) {
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return "", fmt.Errorf("write the gateway's configuration: %w", err)
	}
	path := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		return "", fmt.Errorf("write the gateway's configuration: %w", err)
	}
	return path, nil
}

// embedded is a gateway in this process.
type embedded struct {
	cfg  config.Config
	g    *server.Gateway
	tmp  string // removed at close; "" when the data directory is the user's
	step time.Duration
}

// startEmbedded starts a gateway in this process with cfg (from
// gatewayConfig), in a temporary data directory unless cfg names one.
func startEmbedded(cfg config.Config, tmp string, step time.Duration) (*embedded, error) {
	g, err := server.Start(cfg, server.Deps{})
	if err != nil {
		return nil, fmt.Errorf("embedded gateway: %w", err)
	}
	// Restarts reuse the ports the first start picked.
	cfg.MQTT.TCP = g.Addr().String()
	cfg.Admin.Addr = g.AdminAddr().String()
	return &embedded{cfg: cfg, g: g, tmp: tmp, step: step}, nil
}

func (e *embedded) mqttAddr() string { return e.g.Addr().String() }

// setQuota sets the device's override by the admin API's path
// (server.Gateway.SetOverride): Redis-shared in cluster mode.
func (e *embedded) setQuota(_ context.Context, device string, q devicelimit.Quota) error {
	return e.g.SetOverride(device, devicelimit.Override{Quota: q})
}

// restarter closes the gateway gracefully and starts it again on the
// same data directory; the new one reads a wall clock stepped by
// e.step (--clock-step), as after an operator's `date` or an NTP step
// while the gateway was down.
func (e *embedded) restarter() func(ctx context.Context) error {
	return func(ctx context.Context) error {
		// The run ending must not cut the shutdown short: the final
		// snapshot is what the restart is about.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), server.ShutdownTimeout)
		defer cancel()
		if err := e.g.Close(sctx); err != nil {
			return fmt.Errorf("stop the embedded gateway: %w", err)
		}
		g, err := server.Start(e.cfg, server.Deps{Time: steppedTime{e.step}})
		if err != nil {
			return fmt.Errorf("start the embedded gateway again: %w", err)
		}
		e.g = g
		return nil
	}
}

func (e *embedded) close(ctx context.Context) error {
	err := e.g.Close(ctx)
	if e.tmp != "" {
		os.RemoveAll(e.tmp)
	}
	return err
}

// steppedTime is the real clock with the wall clock moved by step.
type steppedTime struct{ step time.Duration }

func (s steppedTime) Wall() time.Time     { return devicelimit.RealTime.Wall().Add(s.step) }
func (s steppedTime) Mono() time.Duration { return devicelimit.RealTime.Mono() }

// remote is a gateway the simulator did not start; quotas go through
// its admin API when an address and a token are given.
type remote struct {
	addr  string
	admin *admin.Client // nil without --admin-addr
}

func (r *remote) mqttAddr() string                           { return r.addr }
func (r *remote) restarter() func(ctx context.Context) error { return nil }
func (r *remote) close(context.Context) error                { return nil }

func (r *remote) setQuota(ctx context.Context, device string, q devicelimit.Quota) error {
	if r.admin == nil {
		return nil
	}
	return putQuota(ctx, r.admin, device, q)
}

// adminClient is a client of a gateway's admin API.
func adminClient(addr, token string) *admin.Client {
	return &admin.Client{Addr: addr, Token: token, HTTP: &http.Client{Timeout: 10 * time.Second}}
}

// putQuota sets device's override through the admin API.
func putQuota(ctx context.Context, c *admin.Client, device string, q devicelimit.Quota) error {
	body := admin.SetQuotaJSON{Limit: q.Limit, Window: q.Window.String(), Policy: q.Policy.String()}
	if q.NWindows > 0 {
		body.Limit, body.Window, body.Windows = 0, "", admin.WindowsJSON(q.Limits())
	}
	_, _, err := c.SetQuota(ctx, device, body)
	if err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	return nil
}

// applyMix gives every device of a class whose quota is not the
// gateway's default an override with the class's quota.
func applyMix(ctx context.Context, t simTarget, cfg simulator.Config, def devicelimit.Quota) (int, error) {
	n := 0
	for i := range cfg.Devices {
		q := cfg.QuotaOf(i)
		if q == def {
			continue
		}
		if err := t.setQuota(ctx, cfg.DeviceID(i), q); err != nil {
			return n, fmt.Errorf("simulate: --mix: set the quota of %s: %w", cfg.DeviceID(i), err)
		}
		n++
	}
	return n, nil
}

// newTempDataDir makes a data directory removed when the run ends.
func newTempDataDir() (string, error) {
	dir, err := os.MkdirTemp("", "devicegate-simulate-")
	if err != nil {
		return "", fmt.Errorf("simulate: temporary data directory: %w", err)
	}
	return dir, nil
}
