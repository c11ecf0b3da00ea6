package config

import (
	"fmt"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// DefaultRedisTimeout is cluster.redis.timeout when the file does not
// set it: the longest a publish waits for a shared-window decision.
const DefaultRedisTimeout = 50 * time.Millisecond

// MaxRedisTimeout bounds cluster.redis.timeout: a publish never waits
// longer for Redis.
const MaxRedisTimeout = 5 * time.Second

// Cluster configures several gateways sharing device windows and quota
// overrides in Redis. Without cluster.redis.addrs the gateway runs
// alone, with its state in data_dir only (the default).
type Cluster struct {
	Redis Redis `yaml:"redis"`
	// FailurePolicy says what a decision does when Redis is unreachable
	// or slower than Redis.Timeout: "fail-open" admits, "fail-closed"
	// refuses as over the limit, "local" decides on this gateway's own
	// in-memory window.
	FailurePolicy string `yaml:"failure_policy"`
	// Decisions is where device publishes are decided: "owner" (the
	// default), by the gateway the device is connected to, with Redis
	// holding each device's owner, checkpoint and lease (docs/design.md);
	// "redis", one script call per message on the shared windows, the
	// mode that policy defer needs.
	Decisions string `yaml:"decisions"`
	// LeaseShare is, in owner mode, the share of each window a gateway
	// may admit beyond its last checkpoint: what a gateway's crash costs
	// a device at most.
	LeaseShare float64 `yaml:"lease_share"`
	// GatewayTTL is, in owner mode, how long a gateway's liveness in
	// Redis outlives its last renewal: how long a crashed gateway's
	// devices wait before another gateway serves them.
	GatewayTTL Duration `yaml:"gateway_ttl"`
}

// DecisionModes are the values of cluster.decisions, the default first.
var DecisionModes = []string{"owner", "redis"}

// Owner mode's defaults and bounds.
const (
	DefaultLeaseShare = 0.5
	DefaultGatewayTTL = 3 * time.Second
	MinGatewayTTL     = 200 * time.Millisecond
	MaxGatewayTTL     = time.Minute
)

// Redis is how to reach the Redis server (or Redis Cluster) that holds
// the shared state.
type Redis struct {
	// Addrs are host:port addresses; one for a single server, several
	// for the seed nodes of a Redis Cluster.
	Addrs    []string `yaml:"addrs,omitempty"`
	Username string   `yaml:"username,omitempty"`
	// Password is the Redis password; when empty the gateway takes
	// GATEWAY_REDIS_PASSWORD.
	Password string   `yaml:"password,omitempty"`
	TLS      bool     `yaml:"tls,omitempty"`
	DB       int      `yaml:"db,omitempty"`
	Timeout  Duration `yaml:"timeout"`
}

// Enabled reports whether the gateway shares its state in Redis.
func (c Cluster) Enabled() bool { return len(c.Redis.Addrs) > 0 }

// FailurePolicies are the values of cluster.failure_policy.
var FailurePolicies = []string{"fail-open", "fail-closed", "local"}

func (v *validator) cluster(c Cluster) {
	r := c.Redis
	switch {
	case !c.Enabled() && (r.Username != "" || r.Password != "" || r.TLS || r.DB != 0):
		v.add("cluster.redis.addrs", "must list at least one host:port when other cluster.redis keys are set (got none)")
	case len(r.Addrs) > 1 && r.DB != 0:
		v.add("cluster.redis.db", fmt.Sprintf("must be 0 with several addrs: Redis Cluster has only database 0 (got %d)", r.DB))
	}
	seen := make(map[string]int, len(r.Addrs))
	for i, a := range r.Addrs {
		key := fmt.Sprintf("cluster.redis.addrs[%d]", i)
		if j, dup := seen[a]; dup {
			v.add(key, fmt.Sprintf("%q is also cluster.redis.addrs[%d]", a, j))
			continue
		}
		seen[a] = i
		v.tcp(key, a)
	}
	if r.DB < 0 || r.DB > 15 {
		v.add("cluster.redis.db", fmt.Sprintf("must be between 0 and 15 (got %d)", r.DB))
	}
	if t := time.Duration(r.Timeout); t < time.Millisecond || t > MaxRedisTimeout {
		v.add("cluster.redis.timeout", fmt.Sprintf("must be between 1ms and %s (got %q)", MaxRedisTimeout, t.String()))
	}
	ok := false
	for _, p := range FailurePolicies {
		ok = ok || c.FailurePolicy == p
	}
	if c.Decisions != "redis" && c.Decisions != "owner" {
		v.add("cluster.decisions", fmt.Sprintf("must be owner or redis (got %q)", c.Decisions))
	}
	if !(c.LeaseShare > 0 && c.LeaseShare <= 1) {
		v.add("cluster.lease_share", fmt.Sprintf("must be above 0 and at most 1 (got %v)", c.LeaseShare))
	}
	if t := time.Duration(c.GatewayTTL); t < MinGatewayTTL || t > MaxGatewayTTL {
		v.add("cluster.gateway_ttl", fmt.Sprintf("must be between %s and %s (got %q)", MinGatewayTTL, MaxGatewayTTL, t.String()))
	} else if rt := time.Duration(c.Redis.Timeout); c.Decisions == "owner" && 4*rt > t {
		v.add("cluster.gateway_ttl", fmt.Sprintf("must be at least 4 times cluster.redis.timeout (%s) with cluster.decisions: owner, the default: a liveness renewal is given a quarter of it (got %q); or set cluster.decisions: redis", rt, t.String()))
	}
	if !ok {
		v.add("cluster.failure_policy", fmt.Sprintf("must be fail-open, fail-closed or local (got %q)", c.FailurePolicy))
	}
}

// OwnerNoDefer is why policy defer is refused in owner mode, in the
// configuration and in overrides set through the admin API. Owner mode
// is the default with cluster.redis, so the message says so and names
// both ways out.
const OwnerNoDefer = "defer cannot be used with cluster.decisions: owner, the default with cluster.redis: releasing a deferred message would take the device from the gateway it is connected to; set cluster.decisions: redis to defer, or use drop or disconnect"

// ownerDefer refuses policy defer in owner mode: a gateway releasing a
// device's deferred messages would claim the device from the gateway it
// is connected to, and so close its session there.
func (v *validator) ownerDefer(c Config) {
	if !c.Cluster.Enabled() || c.Cluster.Decisions != "owner" {
		return
	}
	const msg = OwnerNoDefer
	check := func(key string, q Quota, ckey string, cs []Class) {
		if q.Policy == devicelimit.PolicyDefer {
			v.add(key+".policy", msg)
		}
		for i, cl := range cs {
			if cl.Quota.Policy == devicelimit.PolicyDefer {
				v.add(fmt.Sprintf("%s[%d].quota.policy", ckey, i), msg)
			}
		}
	}
	check("limits.default", c.Limits.Default, "limits.classes", c.Limits.Classes)
	for i, r := range c.Limits.Rules {
		check(fmt.Sprintf("limits.rules[%d].quota", i), r.Quota, fmt.Sprintf("limits.rules[%d].classes", i), r.Classes)
	}
}
