package config

import (
	"strings"
	"testing"
	"time"
)

func TestClusterDefaultIsEmbedded(t *testing.T) {
	c := Default()
	if c.Cluster.Enabled() {
		t.Fatal("default config shares state in redis")
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Cluster.Redis.Timeout != Duration(50*time.Millisecond) || c.Cluster.FailurePolicy != "local" ||
		c.Cluster.Decisions != "owner" || c.Cluster.LeaseShare != 0.5 || c.Cluster.GatewayTTL != Duration(3*time.Second) {
		t.Fatalf("defaults %+v", c.Cluster)
	}
}

func TestClusterParse(t *testing.T) {
	c, err := Parse(strings.NewReader(`
cluster:
  redis:
    addrs: ["127.0.0.1:6379"]
    username: gw
    password: secret
    tls: true
    db: 3
    timeout: 20ms
  failure_policy: fail-closed
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	r := c.Cluster.Redis
	if !c.Cluster.Enabled() || r.Addrs[0] != "127.0.0.1:6379" || r.Username != "gw" || r.Password != "secret" || !r.TLS || r.DB != 3 ||
		r.Timeout != Duration(20*time.Millisecond) || c.Cluster.FailurePolicy != "fail-closed" {
		t.Fatalf("parsed %+v", c.Cluster)
	}
}

// TestClusterBadValues: each bad value is named by its key and value.
func TestClusterBadValues(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"cluster: {redis: {addrs: [\"redis\"]}}", `cluster.redis.addrs[0]: must be host:port such as ":1883" or "127.0.0.1:1883" (got "redis")`},
		{"cluster: {redis: {addrs: [\"a:1\", \"a:1\"]}}", `cluster.redis.addrs[1]: "a:1" is also cluster.redis.addrs[0]`},
		{"cluster: {redis: {addrs: [\"a:1\"], db: 16}}", `cluster.redis.db: must be between 0 and 15 (got 16)`},
		{"cluster: {redis: {addrs: [\"a:1\", \"b:1\"], db: 1}}", `cluster.redis.db: must be 0 with several addrs`},
		{"cluster: {redis: {addrs: [\"a:1\"], timeout: 0s}}", `cluster.redis.timeout: must be between 1ms and 5s (got "0s")`},
		{"cluster: {redis: {addrs: [\"a:1\"], timeout: 1m}}", `cluster.redis.timeout: must be between 1ms and 5s (got "1m0s")`},
		{"cluster: {redis: {addrs: [\"a:1\"]}, failure_policy: open}", `cluster.failure_policy: must be fail-open, fail-closed or local (got "open")`},
		{"cluster: {redis: {password: x}}", `cluster.redis.addrs: must list at least one host:port when other cluster.redis keys are set`},
		{"limits: {default: {limit: 1, window: 1m, policy: defer}}\ncluster: {redis: {addrs: [\"a:1\"]}, decisions: owner}", `limits.default.policy: defer cannot be used with cluster.decisions: owner, the default with cluster.redis`},
		{"cluster: {redis: {addrs: [\"a:1\"]}, decisions: local}", `cluster.decisions: must be owner or redis (got "local")`},
		{"cluster: {redis: {addrs: [\"a:1\"]}, lease_share: 0}", `cluster.lease_share: must be above 0 and at most 1 (got 0)`},
		{"cluster: {redis: {addrs: [\"a:1\"]}, lease_share: 1.5}", `cluster.lease_share: must be above 0 and at most 1 (got 1.5)`},
		{"cluster: {redis: {addrs: [\"a:1\"]}, gateway_ttl: 10ms}", `cluster.gateway_ttl: must be between 200ms and 1m0s (got "10ms")`},
		{"cluster: {redis: {addrs: [\"a:1\"], timeout: 1s}, decisions: owner, gateway_ttl: 2s}", `cluster.gateway_ttl: must be at least 4 times cluster.redis.timeout (1s) with cluster.decisions: owner`},
		{"cluster: {redis: {addrs: [\"a:1\"], timeout: 1s}}", `cluster.gateway_ttl: must be at least 4 times cluster.redis.timeout (1s) with cluster.decisions: owner, the default`},
	} {
		c, err := Parse(strings.NewReader(tc.yaml))
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.yaml, err, tc.want)
		}
	}
	if _, err := Parse(strings.NewReader("cluster: {redis: {addr: \"a:1\"}}")); err == nil || !strings.Contains(err.Error(), `cluster.redis.addr: unknown key`) {
		t.Errorf("unknown key: %v", err)
	}
}

// TestClusterDefaultOwnerRefusesDefer: with cluster.redis and no
// cluster.decisions, publishes are decided where the device is (owner
// mode), so policy defer is refused wherever a quota can set it (the
// default quota, a rule's, a topic class's of either), each named by its
// key with what to do; with cluster.decisions: redis, or without
// cluster.redis, the same quotas are valid.
func TestClusterDefaultOwnerRefusesDefer(t *testing.T) {
	const limits = `limits:
  default: {limit: 5, window: 1m, policy: defer}
  classes:
    - {name: alerts, topics: ["devices/+/alert"], quota: {limit: 1, window: 1m, policy: defer}}
  rules:
    - match: {client_id: "sensor-*"}
      quota: {limit: 10, window: 1m, policy: defer}
      classes:
        - {name: bulk, topics: ["devices/+/bulk"], quota: {limit: 1, window: 1m, policy: defer}}
`
	const cluster = "cluster: {redis: {addrs: [\"127.0.0.1:6379\"]}}\n"
	c, err := Parse(strings.NewReader(limits + cluster))
	if err != nil {
		t.Fatal(err)
	}
	if c.Cluster.Decisions != "owner" {
		t.Fatalf("cluster.decisions %q without the key, want owner", c.Cluster.Decisions)
	}
	err = c.Validate()
	for _, key := range []string{"limits.default.policy", "limits.classes[0].quota.policy", "limits.rules[0].quota.policy", "limits.rules[0].classes[0].quota.policy"} {
		want := key + ": defer cannot be used with cluster.decisions: owner, the default with cluster.redis: releasing a deferred message would take the device from the gateway it is connected to; set cluster.decisions: redis to defer, or use drop or disconnect"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want %q", err, want)
		}
	}
	for _, ok := range []string{limits + "cluster: {redis: {addrs: [\"127.0.0.1:6379\"]}, decisions: redis}\n", limits} {
		c, err := Parse(strings.NewReader(ok))
		if err == nil {
			err = c.Validate()
		}
		if err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}
