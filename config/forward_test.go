package config

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestForwardConfig: a valid forward list parses and validates; each bad
// value is refused under its key, naming the value.
func TestForwardConfig(t *testing.T) {
	good := `forward:
  - name: cloud
    to: "mqtt://127.0.0.1:1884"
    topics: ["devices/#"]
    local_prefix: "devices/"
    remote_prefix: "site-7/devices/"
    max_qos: 1
    connections: 4
    rate: 100
    max_age: 1h
    keepalive: 20s
    max_backoff: 5s
    dead_after_closes: 5
    persistent_session: true
    username: gw
    password_env: UPSTREAM_PASSWORD
`
	c, err := Parse(strings.NewReader(good))
	if err == nil {
		err = c.Validate()
	}
	if err != nil || len(c.Forward) != 1 || c.Forward[0].Addr() != "127.0.0.1:1884" || c.Forward[0].Topics[0] != "devices/#" ||
		c.Forward[0].Connections != 4 || *c.Forward[0].Rate != 100 || !c.Forward[0].PersistentSession || c.Forward[0].MaxBackoff != Duration(5*time.Second) ||
		c.Forward[0].Closes() != 5 || (Forward{}).Closes() != DefaultDeadAfterCloses {
		t.Fatalf("good forward: %+v, %v", c.Forward, err)
	}
	if c, err := Parse(strings.NewReader(`forward: [{name: s, to: "redis://127.0.0.1:6379/2", topics: ["devices/#"], stream: "telemetry:{device}", max_len: 100000}]`)); err != nil ||
		c.Validate() != nil || c.Forward[0].Kind() != "redis" || c.Forward[0].RedisDB() != 2 || c.Forward[0].MaxLen != 100000 {
		t.Fatalf("a redis destination: %+v %v", c.Forward, err)
	}
	for _, d := range []struct{ yaml, kind, hosts string }{
		{`{name: n, to: "natss://a:4222,b:4223", topics: [t], subject: "fleet.{device}.{topic}", creds_file: x.creds, tls: {ca_file: ca.pem}}`, "nats", "a:4222,b:4223"},
		{`{name: k, to: "kafka://a:9092,[::1]:9093", topics: [t], kafka_topic: "telemetry-{device}", sasl: SCRAM-SHA-512, username: u, password_env: P}`, "kafka", "a:9092,[::1]:9093"},
		{`{name: r, to: "rediss://a:6380/3", topics: [t], tls: {server_name: r.example}}`, "redis", "a:6380"},
		{`{name: p, to: "nats://a:4222", topics: [t]}`, "nats", "a:4222"},
		// Schemes are case-insensitive (RFC 3986, 3.1).
		{`{name: u, to: "MQTTS://a:8883", topics: [t]}`, "mqtt", "a:8883"},
		{`{name: v, to: "Rediss://a:6380/3", topics: [t]}`, "redis", "a:6380"},
	} {
		c, err := Parse(strings.NewReader("forward: [" + d.yaml + "]"))
		if err == nil {
			err = c.Validate()
		}
		if err != nil || c.Forward[0].Kind() != d.kind || strings.Join(c.Forward[0].Hosts(), ",") != d.hosts || c.Forward[0].Secure() != (d.kind != "kafka" && d.hosts != "a:4222") {
			t.Fatalf("%s: %+v, %v", d.yaml, c.Forward, err)
		}
	}
	for to, want := range map[string]int{"mqtt://x:1": 100, "redis://x:1": 1000, "nats://x:1": 1000, "kafka://x:1": 1000} {
		if got := (Forward{To: to}).Inflight(); got != want {
			t.Errorf("default max_inflight of %s: %d, want %d", to, got, want)
		}
	}
	if got := (Forward{To: "nats://x:1", MaxInflight: 7}).Inflight(); got != 7 {
		t.Errorf("max_inflight 7 gives %d", got)
	}
	if c, err := Parse(strings.NewReader(`forward: [{name: a, to: "mqtt://x:1", topics: [t]}]`)); err != nil || c.Forward[0].MaxQoS != 1 {
		t.Fatalf("max_qos not given: %+v %v, want 1", c.Forward, err)
	}
	if c, err := Parse(strings.NewReader(`forward: [{name: a, to: "mqtt://x:1", topics: [t], max_qos: 0}]`)); err != nil || c.Forward[0].MaxQoS != 0 {
		t.Fatalf("max_qos 0: %+v %v", c.Forward, err)
	}
	for _, tc := range []struct{ yaml, want string }{
		{`forward: [{name: a, to: "http://x:1", topics: [t]}]`, `forward[0].to: must be mqtt[s]://host:port, redis[s]://host:port[/DB], nats[s]://host:port[,host:port...] or kafka[s]://host:port[,host:port...]: unknown kind of destination "http" (got "http://x:1")`},
		{`forward: [{name: a, to: "mqtt://x", topics: [t]}]`, `forward[0].to: must be mqtt://host:port, with the port (got "mqtt://x")`},
		{`forward: [{name: a, to: "mqtts://u:p@x:8883", topics: [t]}]`, `forward[0].to: must be mqtts://host:port: credentials go in username and a password key, not in to (got "mqtts://u:p@x:8883")`},
		{`forward: [{name: a, to: "redis://x:6379/16", topics: [t]}]`, `forward[0].to: the database after the address must be 0 to 15 (got "redis://x:6379/16")`},
		{`forward: [{name: a, to: "redis://x:6379", topics: [t], subscribe: [c]}]`, `forward[0].subscribe: is for mqtt:// and mqtts:// destinations; to is "redis://x:6379"`},
		{`forward: [{name: a, to: "redis://x:6379", topics: [t], stream: "s:{tenant}"}]`, `forward[0].stream: may hold {topic} and {device}, nothing else in braces (got "s:{tenant}")`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], stream: "s"}]`, `forward[0].stream: is for redis:// and rediss:// destinations; to is "mqtt://x:1"`},
		{`forward: [{name: a, to: "nats://x:4222", topics: [t], subject: "devices.+.t"}]`, `forward[0].subject: must not hold '+' (got "devices.+.t")`},
		{`forward: [{name: a, to: "nats://x:4222", topics: [t], subject: "devices.>"}]`, `forward[0].subject: must not hold '>' (got "devices.>")`},
		{`forward: [{name: a, to: "nats://x:4222", topics: [t], subject: "devices..{topic}"}]`, `forward[0].subject: must not have an empty token`},
		{`forward: [{name: a, to: "nats://x:4222,y", topics: [t]}]`, `forward[0].to: must be nats://host:port, with the port (got "nats://x:4222,y")`},
		{`forward: [{name: a, to: "nats://x:4222", topics: [t], creds_file: c.creds, username: u, password: p}]`, `forward[0].creds_file: give either creds_file or username and a password`},
		{`forward: [{name: a, to: "amqp://x:5672", topics: [t]}]`, `forward[0].to: must be mqtt[s]://host:port, redis[s]://host:port[/DB], nats[s]://host:port[,host:port...] or kafka[s]://host:port[,host:port...]: unknown kind of destination "amqp" (got "amqp://x:5672")`},
		{`forward: [{name: a, to: "kafka://x:9092", topics: [t]}]`, `forward[0].kafka_topic: must name the Kafka topic: fixed text, {topic} and {device} (got "")`},
		{`forward: [{name: a, to: "kafka://x:9092", topics: [t], kafka_topic: ""}]`, `forward[0].kafka_topic: must name the Kafka topic`},
		{`forward: [{name: a, to: "kafka://x:9092", topics: [t], kafka_topic: "devices/{device}"}]`, `forward[0].kafka_topic: must not hold '/' (got "devices/{device}")`},
		{`forward: [{name: a, to: "kafka://x:9092", topics: [t], kafka_topic: k, sasl: GSSAPI, username: u, password: p}]`, `forward[0].sasl: must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (got "GSSAPI")`},
		{`forward: [{name: a, to: "kafka://x:9092", topics: [t], kafka_topic: k, sasl: PLAIN}]`, `forward[0].sasl: a SASL mechanism and a username go together (got sasl "PLAIN", username "")`},
		{`forward: [{name: a, to: "kafka://x:9092", topics: [t], kafka_topic: k, subject: s}]`, `forward[0].subject: is for nats:// and natss:// destinations; to is "kafka://x:9092"`},
		{`forward: [{name: a, to: "redis://x:6379,y:6379", topics: [t]}]`, `one host:port for redis (got "redis://x:6379,y:6379")`},
		{`forward: [{name: a, to: "redis://x:6379", topics: [t], max_len: -1}]`, `forward[0].max_len: must be >= 0, 0 for no bound (got -1)`},
		{`forward: [{name: a, to: "redis://x:6379", topics: [t], adopt: [a]}]`, `forward[0].adopt[0]: "a" is an entry of forward: (its logs are its own)`},
		{`forward: [{name: a, to: "redis://x:6379", topics: [t], adopt: ["x/0"]}]`, `forward[0].adopt[0]: must be a former entry's name, 1 to 64 bytes without '/' (got "x/0")`},
		{`forward: [{name: a, to: "redis://x:6379", topics: [t], adopt: [old]}, {name: b, to: "redis://x:6379", topics: [t], adopt: [old]}]`, `forward[1].adopt[0]: "old" is adopted twice`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], tls: {ca_file: ca.pem}}]`, `forward[0].tls: is for a destination over TLS: mqtts://, rediss://, natss:// or kafkas:// (to is "mqtt://x:1")`},
		{`forward: [{name: a, to: "mqtts://x:1", topics: [t], tls: {cert_file: c.pem}}]`, `forward[0].tls.key_file: cert_file and key_file go together`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], username: u, password: p, password_env: P}]`, `forward[0].password: give one of password, password_file and password_env`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], password_file: /p}]`, `forward[0].username: a password needs a username`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], connections: 65}]`, `forward[0].connections: must be 1 to 64 (got 65)`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], max_inflight: -1}]`, `forward[0].max_inflight: must be 1 to 65535, or 0 for the default (got -1)`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], rate: 0}]`, `forward[0].rate: must be > 0 messages per second, or left out for no bound (got 0)`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], rate: fast}]`, `forward[0].rate: must be a number (got`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], max_age: -1s}]`, `forward[0].max_age: must be >= 0`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], keepalive: 100ms}]`, `forward[0].keepalive: must be 1s to 18h`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], max_backoff: 500ms}]`, `forward[0].max_backoff: must be 1s to 1h, or 0 for 10s (got 500ms)`},
		{`forward: [{name: a, to: "redis://x:1", topics: [t], max_backoff: 2h}]`, `forward[0].max_backoff: must be 1s to 1h, or 0 for 10s (got 2h0m0s)`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], dead_after_closes: -1}]`, `forward[0].dead_after_closes: must be 1 to 1000, or 0 for never (got -1)`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], local_prefix: "devices", remote_prefix: "site/"}]`, `forward[0].remote_prefix: local_prefix and remote_prefix must end in '/'`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], local_prefix: "d/", remote_prefix: "$aws/"}]`, `forward[0].remote_prefix: local_prefix and remote_prefix take no wildcards and no '$' start`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], tlss: {}}]`, `forward[0].tlss: unknown key`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], mqtt_version: 4}]`, `forward[0].mqtt_version: must be "3.1.1" or "5" (got "4")`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: ["a/#/b"]}]`, `forward[0].topics[0]: is not a valid topic filter`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: []}]`, `forward[0].topics: must list at least one topic filter`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], local_prefix: "devices/"}]`, `forward[0].remote_prefix: local_prefix and remote_prefix go together`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], max_qos: 2}]`, `forward[0].max_qos: must be 0 or 1 (got 2)`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], subscribe: ["cmd/#/x"]}]`, `forward[0].subscribe[0]: is not a valid topic filter`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], overflow: block}]`, `forward[0].overflow: must be drop_oldest or refuse_new (got "block")`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], max_bytes: 1TB}]`, `forward[0].max_bytes: must be a size in bytes`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t]}, {name: a, to: "mqtt://y:1", topics: [t]}]`, `forward[1].name: "a" names two upstreams`},
	} {
		c, err := Parse(strings.NewReader(tc.yaml))
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

// TestForwardSecret: the password comes from password, the first line
// of password_file, or password_env; a missing file or variable is an
// error naming the key.
func TestForwardSecret(t *testing.T) {
	env := map[string]string{"P": "from-env"}
	files := map[string]string{"/p": "from-file\nsecond line\n"}
	getenv := func(k string) string { return env[k] }
	read := func(f string) ([]byte, error) {
		if v, ok := files[f]; ok {
			return []byte(v), nil
		}
		return nil, os.ErrNotExist
	}
	for _, c := range []struct {
		f         Forward
		want, err string
	}{
		{Forward{Password: "plain"}, "plain", ""},
		{Forward{PasswordFile: "/p"}, "from-file", ""},
		{Forward{PasswordEnv: "P"}, "from-env", ""},
		{Forward{PasswordFile: "/missing"}, "", "password_file: file does not exist"},
		{Forward{PasswordEnv: "UNSET"}, "", "password_env: the environment variable UNSET is not set"},
	} {
		got, err := c.f.Secret(getenv, read)
		if got != c.want || (err == nil) != (c.err == "") || err != nil && err.Error() != c.err {
			t.Errorf("%+v: %q, %v; want %q, %q", c.f, got, err, c.want, c.err)
		}
	}
}
