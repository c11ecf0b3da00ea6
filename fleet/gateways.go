package fleet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/devicegate/devicegate/admin"
	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/freeport"
)

// Gateways are gateway processes (`gateway serve`) in cluster mode,
// sharing one Redis: the fleet's gateways. Each has its own data
// directory and configuration file under the directory given to
// StartGateways.
type Gateways struct {
	// Addrs are the gateways' MQTT addresses, in order.
	Addrs []string
	list  []*child
}

// GatewaySpec is what every gateway of a fleet shares.
type GatewaySpec struct {
	// Bin is the gateway binary.
	Bin string
	// Redis are the cluster.redis.addrs: one server, or seed nodes of a
	// Redis Cluster; empty for gateways that run alone (standalone).
	Redis []string
	// Quota is every device's default quota (limits.default).
	Quota devicelimit.Quota
	// FailurePolicy is cluster.failure_policy; default "local".
	FailurePolicy string
	// RedisTimeout is cluster.redis.timeout; default the gateway's.
	RedisTimeout time.Duration
	// Decisions is cluster.decisions: "redis" (a script call per
	// message) or "owner" (decided by the gateway the device is on);
	// default the gateway's (owner).
	Decisions string
	// BehindBalancer raises mqtt.max_pending_per_address to
	// mqtt.max_pending_connections: every device then arrives from the
	// load balancer's address (docs/operations.md).
	BehindBalancer bool
	// TenantGroup, when set, are the windows of the tenant group the
	// one-tenant phase's devices are in (client IDs TenantPrefix-*):
	// a rule of limits.rules puts them there, keeping Quota as their own.
	TenantGroup []devicelimit.Limit
}

// TenantPrefix starts the client IDs of the one-tenant phase's devices;
// TenantGroupName is the group GatewaySpec.TenantGroup puts them in.
const (
	TenantPrefix    = "tenant"
	TenantGroupName = "tenant"
)

// StartGateways starts n gateways under dir and waits until each
// listens.
func StartGateways(dir string, n int, spec GatewaySpec) (*Gateways, error) {
	g := &Gateways{}
	for i := range n {
		c, err := startGateway(filepath.Join(dir, fmt.Sprintf("gateway-%d", i)), spec)
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("gateway %d: %w", i, err)
		}
		g.list, g.Addrs = append(g.list, c), append(g.Addrs, c.addr)
	}
	return g, nil
}

// ParseTenantGroup reads the windows of a tenant group as the
// simulator's --windows does: N/DURATION (messages) or SIZE/DURATION
// (payload bytes), comma-separated, such as "20000/10s".
func ParseTenantGroup(s string) ([]devicelimit.Limit, error) {
	ls, err := devicelimit.ParseLimits(s, ",")
	if err == nil {
		err = devicelimit.ValidateGroupQuota(devicelimit.WithWindows(devicelimit.PolicyDrop, ls...), 1)
	}
	if err != nil {
		return nil, fmt.Errorf("%q: want windows such as 20000/10s or 20000/10s,4MiB/1m: %w", s, err)
	}
	return ls, nil
}

// startGateway writes a gateway's configuration in dir and starts it.
func startGateway(dir string, spec GatewaySpec) (*child, error) {
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return nil, err
	}
	mqttAddr, err := freeport.Addr()
	if err != nil {
		return nil, err
	}
	cfg, err := gatewayConfig(spec, mqttAddr, data)
	if err != nil {
		return nil, err
	}
	file, err := writeConfigFile(dir, cfg)
	if err != nil {
		return nil, err
	}
	return startChild(spec.Bin, []string{"--config", file}, data, nil, true)
}

// gatewayConfig is the configuration of a gateway of spec listening for
// MQTT on mqttAddr with its data in data.
func gatewayConfig(spec GatewaySpec, mqttAddr, data string) (config.Config, error) {
	cfg := config.Default()
	cfg.MQTT.TCP, cfg.Admin.Addr, cfg.DataDir = mqttAddr, "127.0.0.1:0", data
	cfg.Log.Level = slog.LevelInfo // seen to listen by its info lines
	// The simulator's subscribers see every device's messages: backend
	// consumers (docs/operations.md, Sizing).
	cfg.MQTT.Consumers.ClientIDs = append(cfg.MQTT.Consumers.ClientIDs, "simulator-sub-*")
	if spec.BehindBalancer {
		cfg.MQTT.MaxPendingPerAddress = cfg.MQTT.MaxPendingConnections
	}
	q := spec.Quota
	cfg.Limits.Default.Limit, cfg.Limits.Default.Window = q.Limit, config.Duration(q.Window)
	cfg.Limits.Default.Policy = q.Policy
	if len(spec.Redis) > 0 {
		cfg.Cluster.Redis.Addrs = spec.Redis
		cfg.Cluster.FailurePolicy = spec.FailurePolicy
		if cfg.Cluster.FailurePolicy == "" {
			cfg.Cluster.FailurePolicy = "local"
		}
		if spec.RedisTimeout > 0 {
			cfg.Cluster.Redis.Timeout = config.Duration(spec.RedisTimeout)
		}
		if spec.Decisions != "" {
			cfg.Cluster.Decisions = spec.Decisions
		}
		if ttl := 4 * cfg.Cluster.Redis.Timeout; cfg.Cluster.Decisions == "owner" && cfg.Cluster.GatewayTTL < ttl {
			// A liveness renewal is given a quarter of the TTL: a slow
			// Redis (a loaded machine) needs the longer TTL.
			cfg.Cluster.GatewayTTL = ttl
		}
	}
	if len(spec.TenantGroup) > 0 {
		cfg.Limits.Rules = append(cfg.Limits.Rules, config.Rule{
			Name: "tenant", Match: config.Match{ClientID: TenantPrefix + "-*"}, Quota: cfg.Limits.Default,
			Group: &config.Group{Name: TenantGroupName, Quota: config.Quota{Windows: quotaWindows(spec.TenantGroup)}},
		})
	}
	if err := cfg.Validate(); err != nil {
		return config.Config{}, fmt.Errorf("gateway settings: %w", err)
	}
	return cfg, nil
}

// Len is the number of gateways.
func (g *Gateways) Len() int { return len(g.list) }

// PID is gateway i's process ID.
func (g *Gateways) PID(i int) int { return g.list[i].cmd.Process.Pid }

// Alive reports whether gateway i still runs.
func (g *Gateways) Alive(i int) bool {
	select {
	case <-g.list[i].done:
		return false
	default:
		return true
	}
}

// Kill sends gateway i SIGKILL, as a crash, and waits for it to end.
func (g *Gateways) Kill(i int) error {
	return g.list[i].stop(true)
}

// Stats reads every running gateway's CPU time and resident memory;
// a gateway no longer running reads as zero.
func (g *Gateways) Stats() []ProcStats {
	out := make([]ProcStats, len(g.list))
	for i := range g.list {
		if g.Alive(i) {
			out[i], _ = ReadProcStats(g.PID(i))
		}
	}
	return out
}

// Log returns the last lines gateway i logged.
func (g *Gateways) Log(i int) string { return g.list[i].log() }

// Close stops every gateway still running (SIGTERM) and returns the
// first error.
func (g *Gateways) Close() error {
	var errs []error
	for i, c := range g.list {
		if !g.Alive(i) {
			continue
		}
		if err := c.close(context.Background()); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("gateway %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// Connected reports whether device id is connected to gateway i, as
// its admin API says.
func (g *Gateways) Connected(ctx context.Context, i int, id string) (bool, error) {
	d, _, err := g.list[i].admin.Device(ctx, id)
	var api *admin.APIError
	if errors.As(err, &api) && api.Status == http.StatusNotFound {
		return false, nil // never seen there
	}
	if err != nil {
		return false, err
	}
	return d.Connected, nil
}

// Fallbacks sums devicegate_cluster_fallbacks_total over the gateways
// still running: decisions made by the failure policy because Redis did
// not answer within cluster.redis.timeout.
func (g *Gateways) Fallbacks(ctx context.Context) float64 {
	return g.Metric(ctx, "devicegate_cluster_fallbacks_total")
}

// Metric sums the metric name over its labels and the gateways still
// running.
func (g *Gateways) Metric(ctx context.Context, name string) float64 {
	var sum float64
	for i, c := range g.list {
		if g.Alive(i) {
			sum += metricSum(ctx, c.admin.Addr, name)
		}
	}
	return sum
}

// metricSum reads a gateway's /metrics and sums the samples of name
// over their labels; 0 when it cannot.
func metricSum(ctx context.Context, adminAddr, name string) float64 {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+adminAddr+"/metrics", nil)
	if err != nil {
		return 0
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
			sum += v
		}
	}
	return sum
}
