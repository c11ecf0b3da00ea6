package config

import (
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/devicegate/devicegate/devicelimit"
)

// load is what the gateway does with a file: Parse, then Validate.
func load(s string) (Config, error) {
	c, err := Parse(strings.NewReader(s))
	if err != nil {
		return c, err
	}
	return c, c.Validate()
}

func TestDefaultValidates(t *testing.T) {
	d := Default()
	if err := d.Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v, want nil", err)
	}
	if _, err := d.Resolver(); err != nil {
		t.Fatalf("Default().Resolver() = %v, want nil", err)
	}
	if d.MQTT.TCP != ":1883" {
		t.Fatalf("default mqtt.tcp = %q, want %q", d.MQTT.TCP, ":1883")
	}
	if d.DataDir != "./data" || d.Persist.SnapshotInterval != Duration(time.Second) {
		t.Fatalf("default data_dir, persist = %q, %+v; want \"./data\", 1s", d.DataDir, d.Persist)
	}
}

func TestParseEmptyGivesDefault(t *testing.T) {
	for _, in := range []string{"", "\n\n  \n", "# only a comment\n", "---\n", "~\n", "mqtt:\nlimits:\nlog:\n", "data_dir:\npersist:\n", "persist: {snapshot_interval: ~}\n", "limits: {default: ~, rules: ~}\n"} {
		c, err := Parse(strings.NewReader(in))
		if err != nil {
			t.Fatalf("Parse(%q) error: %v", in, err)
		}
		if !reflect.DeepEqual(c, Default()) {
			t.Fatalf("Parse(%q) = %+v, want Default() %+v", in, c, Default())
		}
	}
}

// TestKeys has, for every key, values that load and values that fail,
// with the text the error must contain: the full key and the value.
func TestKeys(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want func(Config) bool // for good values
		err  []string          // for bad values: substrings of the error
	}{
		// admin
		{name: "admin default", yaml: `mqtt: {}`, want: func(c Config) bool { return c.Admin.Addr == "127.0.0.1:8080" && c.Admin.Token == "" && c.Admin.Console }},
		{name: "admin console off", yaml: `admin: {console: false}`, want: func(c Config) bool { return !c.Admin.Console }},
		{name: "admin console not a bool", yaml: `admin: {console: maybe}`, err: []string{`console`, `maybe`}},
		{name: "admin addr port 0", yaml: `admin: {addr: "127.0.0.1:0"}`, want: func(c Config) bool { return c.Admin.Addr == "127.0.0.1:0" }},
		{name: "admin token", yaml: `admin: {token: "s3cret"}`, want: func(c Config) bool { return c.Admin.Token == "s3cret" }},
		{name: "admin token inner space", yaml: `admin: {token: "s3 cret"}`, want: func(c Config) bool { return c.Admin.Token == "s3 cret" }},
		{name: "admin token trailing space", yaml: `admin: {token: "s3cret "}`, err: []string{`admin.token: must not begin or end with white space`}},
		{name: "admin token blank", yaml: `admin: {token: "  "}`, err: []string{`admin.token: must not begin or end with white space`}},
		{name: "admin token newline", yaml: `admin: {token: "s3\ncret"}`, err: []string{`admin.token: must not contain control characters`}},
		{name: "admin addr no port", yaml: `admin: {addr: "localhost"}`, err: []string{`admin.addr: must be host:port`, `(got "localhost")`}},
		{name: "admin addr port range", yaml: `admin: {addr: ":70000"}`, err: []string{`admin.addr:`, `(got ":70000")`}},
		{name: "admin unknown", yaml: `admin: {tsl: true}`, err: []string{`admin.tsl: unknown key; expected one of addr, token, tls`}},

		// mqtt.tcp
		{name: "tcp any host", yaml: `mqtt: {tcp: ":1884"}`, want: func(c Config) bool { return c.MQTT.TCP == ":1884" }},
		{name: "tcp port 0", yaml: `mqtt: {tcp: "127.0.0.1:0"}`, want: func(c Config) bool { return c.MQTT.TCP == "127.0.0.1:0" }},
		{name: "tcp ipv6", yaml: `mqtt: {tcp: "[::1]:1883"}`, want: func(c Config) bool { return c.MQTT.TCP == "[::1]:1883" }},
		{name: "tcp no port", yaml: `mqtt: {tcp: "localhost"}`, err: []string{`mqtt.tcp: must be host:port`, `(got "localhost")`}},
		{name: "tcp bare number", yaml: `mqtt: {tcp: 1883}`, err: []string{`mqtt.tcp: must be host:port`, `(got "1883")`}},
		{name: "tcp empty port", yaml: `mqtt: {tcp: "localhost:"}`, err: []string{`mqtt.tcp:`, `port must be a number from 0 to 65535 (got "localhost:")`}},
		{name: "tcp port range", yaml: `mqtt: {tcp: ":65536"}`, err: []string{`mqtt.tcp:`, `(got ":65536")`}},
		{name: "tcp empty", yaml: `mqtt: {tcp: ""}`, err: []string{`mqtt.tcp: must be host:port`, `(got "")`}},
		{name: "tcp mapping", yaml: "mqtt:\n  tcp: {port: 1}\n", err: []string{`line 2: mqtt.tcp: must be a string (got a mapping)`}},
		{name: "mqtt scalar", yaml: "mqtt: 1883\n", err: []string{`line 1: mqtt: must be a mapping of keys (got 1883)`}},

		// data_dir
		{name: "data dir relative", yaml: `data_dir: state`, want: func(c Config) bool { return c.DataDir == "state" }},
		{name: "data dir absolute", yaml: `data_dir: "/var/lib/devicegate"`, want: func(c Config) bool { return c.DataDir == "/var/lib/devicegate" }},
		{name: "data dir null keeps default", yaml: `data_dir: ~`, want: func(c Config) bool { return c.DataDir == "./data" }},
		{name: "data dir empty", yaml: `data_dir: ""`, err: []string{`data_dir: must name a directory (got "")`}},
		{name: "data dir NUL", yaml: `data_dir: "a\0b"`, err: []string{`data_dir: must not contain a NUL byte (got "a\x00b")`}},
		{name: "data dir number", yaml: "data_dir: 5\n", want: func(c Config) bool { return c.DataDir == "5" }},
		{name: "data dir list", yaml: "data_dir: [a]\n", err: []string{`line 1: data_dir: must be a string (got a list)`}},

		// persist.snapshot_interval
		{name: "snapshot interval ms", yaml: `persist: {snapshot_interval: 100ms}`, want: func(c Config) bool {
			return c.Persist.SnapshotInterval == Duration(100*time.Millisecond)
		}},
		{name: "snapshot interval max", yaml: `persist: {snapshot_interval: 1h}`, want: func(c Config) bool {
			return c.Persist.SnapshotInterval == Duration(time.Hour)
		}},
		{name: "snapshot interval 1ns", yaml: `persist: {snapshot_interval: 1ns}`, want: func(c Config) bool {
			return c.Persist.SnapshotInterval == 1
		}},
		{name: "check on start after crash", yaml: `persist: {check_on_start: after_crash}`, want: func(c Config) bool { return c.Persist.CheckOnStart == "after_crash" }},
		{name: "after crash forgive", yaml: `persist: {after_crash: forgive}`, want: func(c Config) bool { return c.Persist.AfterCrash == "forgive" }},
		{name: "after crash bad", yaml: `persist: {after_crash: pardon}`, err: []string{`persist.after_crash: must be charge or forgive (got "pardon")`}},
		{name: "check on start bad", yaml: `persist: {check_on_start: sometimes}`, err: []string{`persist.check_on_start: must be always, after_crash or never (got "sometimes")`}},
		{name: "snapshot interval zero", yaml: `persist: {snapshot_interval: 0s}`, err: []string{`persist.snapshot_interval: must be > 0 (got "0s")`}},
		{name: "snapshot interval negative", yaml: `persist: {snapshot_interval: -1s}`, err: []string{`persist.snapshot_interval: must be > 0 (got "-1s")`}},
		{name: "snapshot interval too long", yaml: `persist: {snapshot_interval: 61m}`, err: []string{`persist.snapshot_interval: must be at most 1h0m0s (got "1h1m0s")`}},
		{name: "snapshot interval bare number", yaml: "persist:\n  snapshot_interval: 1\n", err: []string{`line 2: persist.snapshot_interval: must be a duration like "10s" (got 1)`}},
		{name: "persist unknown key", yaml: "persist:\n  fsync: false\n", err: []string{`line 2: persist.fsync: unknown key; expected one of snapshot_interval`}},
		{name: "persist scalar", yaml: "persist: 1s\n", err: []string{`line 1: persist: must be a mapping of keys (got "1s")`}},

		// limits.default.limit
		{name: "limit min", yaml: `limits: {default: {limit: 1}}`, want: func(c Config) bool { return c.Limits.Default.Limit == 1 }},
		{name: "limit max", yaml: `limits: {default: {limit: 1000000000}}`, want: func(c Config) bool { return c.Limits.Default.Limit == devicelimit.MaxLimit }},
		{name: "limit keeps other defaults", yaml: `limits: {default: {limit: 7}}`, want: func(c Config) bool {
			return reflect.DeepEqual(c.Limits.Default, Quota{Limit: 7, Window: Duration(10 * time.Second), Policy: devicelimit.PolicyDrop})
		}},
		{name: "limit zero", yaml: `limits: {default: {limit: 0}}`, err: []string{`limits.default.limit: must be between 1 and 1000000000 (got 0)`}},
		{name: "limit negative", yaml: `limits: {default: {limit: -5}}`, err: []string{`limits.default.limit: must be between 1 and 1000000000 (got -5)`}},
		{name: "limit too big", yaml: `limits: {default: {limit: 1000000001}}`, err: []string{`limits.default.limit: must be between 1 and 1000000000 (got 1000000001)`}},
		{name: "limit string", yaml: `limits: {default: {limit: ten}}`, err: []string{`limits.default.limit: must be an integer (got "ten")`}},
		{name: "limit float", yaml: `limits: {default: {limit: 1.5}}`, err: []string{`limits.default.limit: must be an integer (got 1.5)`}},

		// limits.default.window
		{name: "window ms", yaml: `limits: {default: {window: 500ms}}`, want: func(c Config) bool { return c.Limits.Default.Window == Duration(500*time.Millisecond) }},
		{name: "window compound", yaml: `limits: {default: {window: "1h30m"}}`, want: func(c Config) bool { return c.Limits.Default.Window == Duration(90*time.Minute) }},
		{name: "window zero", yaml: `limits: {default: {window: 0s}}`, err: []string{`limits.default.window: must be > 0 (got "0s")`}},
		{name: "window negative", yaml: `limits: {default: {window: -1s}}`, err: []string{`limits.default.window: must be > 0 (got "-1s")`}},
		{name: "window bare number", yaml: "limits:\n  default:\n    window: 10\n", err: []string{`line 3: limits.default.window: must be a duration like "10s" (got 10)`}},
		{name: "window bare zero", yaml: `limits: {default: {window: 0}}`, err: []string{`limits.default.window: must be a duration like "10s" (got 0)`}},
		{name: "window unparsable", yaml: `limits: {default: {window: ten seconds}}`, err: []string{`limits.default.window: must be a duration like "10s" (got "ten seconds")`}},
		{name: "window too long", yaml: `limits: {default: {window: 721h}}`, err: []string{`limits.default.window: must be at most 720h0m0s (got "721h0m0s")`}},
		{name: "window shorter than buckets", yaml: `limits: {default: {window: 10ms}}`, err: []string{`limits.default.window: 10ms divided into 20 buckets`}},
		{name: "window fits fewer buckets", yaml: `limits: {default: {window: 10ms}, buckets: 10}`, want: func(c Config) bool { return c.Limits.Buckets == 10 }},

		// limits.default.policy
		{name: "policy drop", yaml: `limits: {default: {policy: drop}}`, want: func(c Config) bool { return c.Limits.Default.Policy == devicelimit.PolicyDrop }},
		{name: "policy disconnect", yaml: `limits: {default: {policy: disconnect}}`, want: func(c Config) bool { return c.Limits.Default.Policy == devicelimit.PolicyDisconnect }},
		{name: "policy defer", yaml: `limits: {default: {policy: defer}}`, want: func(c Config) bool { return c.Limits.Default.Policy == devicelimit.PolicyDefer }},
		{name: "policy unknown", yaml: `limits: {default: {policy: block}}`, err: []string{`limits.default.policy: must be drop, defer or disconnect (got "block")`}},
		{name: "policy case", yaml: `limits: {default: {policy: DROP}}`, err: []string{`limits.default.policy: must be drop, defer or disconnect (got "DROP")`}},

		// limits.defer
		{name: "defer sizes", yaml: `limits: {defer: {max_messages_per_device: 50, max_bytes_per_device: 64KiB, max_total_bytes: 1073741824, max_age: 10m}}`,
			want: func(c Config) bool {
				d := c.Limits.Defer
				return d.MaxMessagesPerDevice == 50 && d.MaxBytesPerDevice == 64<<10 && d.MaxTotalBytes == 1<<30 && d.MaxAge == Duration(10*time.Minute)
			}},
		{name: "defer size unit", yaml: `limits: {defer: {max_total_bytes: 2GiB}}`, want: func(c Config) bool { return c.Limits.Defer.MaxTotalBytes == 2<<30 }},
		{name: "defer size bad unit", yaml: `limits: {defer: {max_total_bytes: 2GB}}`,
			err: []string{`limits.defer.max_total_bytes: must be a size in bytes like 1048576 or "1MiB" (got "2GB")`}},
		{name: "defer size negative", yaml: `limits: {defer: {max_bytes_per_device: -1}}`,
			err: []string{`limits.defer.max_bytes_per_device: must be a size in bytes like 1048576 or "1MiB" (got -1)`}},
		{name: "defer zero messages", yaml: `limits: {defer: {max_messages_per_device: 0}}`,
			err: []string{`limits.defer.max_messages_per_device: must be between 1 and 1000000 (got 0)`}},
		{name: "defer zero bytes", yaml: `limits: {defer: {max_bytes_per_device: 0}}`,
			err: []string{`limits.defer.max_bytes_per_device: must be at least 1B (got 0B)`}},
		{name: "defer total below device", yaml: `limits: {defer: {max_total_bytes: 1KiB}}`,
			err: []string{`limits.defer.max_total_bytes: must be at least limits.defer.max_bytes_per_device, 1MiB (got 1KiB)`}},
		{name: "defer zero age", yaml: `limits: {defer: {max_age: 0s}}`,
			err: []string{`limits.defer.max_age: must be > 0 and at most 720h0m0s (got "0s")`}},
		{name: "defer bare age", yaml: `limits: {defer: {max_age: 60}}`,
			err: []string{`limits.defer.max_age: must be a duration like "10s" (got 60)`}},
		{name: "defer unknown key", yaml: `limits: {defer: {max_msgs: 5}}`,
			err: []string{`limits.defer.max_msgs: unknown key; expected one of max_messages_per_device, max_bytes_per_device, max_total_bytes, max_age, restore_delay`}},
		{name: "defer restore delay", yaml: `limits: {defer: {restore_delay: 0s}}`, want: func(c Config) bool { return c.Limits.Defer.RestoreDelay == 0 }},
		{name: "defer restore delay negative", yaml: `limits: {defer: {restore_delay: -1s}}`,
			err: []string{`limits.defer.restore_delay: must be between 0s and 1h (got "-1s")`}},

		// limits.buckets
		{name: "buckets 1", yaml: `limits: {buckets: 1}`, want: func(c Config) bool { return c.Limits.Buckets == 1 }},
		{name: "buckets max", yaml: `limits: {buckets: 1000}`, want: func(c Config) bool { return c.Limits.Buckets == 1000 }},
		{name: "buckets zero", yaml: `limits: {buckets: 0}`, err: []string{`limits.buckets: must be between 1 and 1000 (got 0)`}},
		{name: "buckets too many", yaml: `limits: {buckets: 1001}`, err: []string{`limits.buckets: must be between 1 and 1000 (got 1001)`}},
		{name: "buckets string", yaml: `limits: {buckets: "20"}`, err: []string{`limits.buckets: must be an integer (got "20")`}},

		// limits.identity
		{name: "identity client_id", yaml: `limits: {identity: client_id}`, want: func(c Config) bool { return c.Limits.Identity == devicelimit.IdentityClientID }},
		{name: "identity username", yaml: `limits: {identity: username}`, want: func(c Config) bool { return c.Limits.Identity == devicelimit.IdentityUsername }},
		{name: "identity ip", yaml: `limits: {identity: ip}`, err: []string{`limits.identity: must be client_id or username (got "ip")`}},

		// limits.rules
		{name: "rule full", yaml: `
limits:
  rules:
    - name: sensors
      match: {client_id: "sensor-*", username: "fleet-?"}
      quota: {limit: 10, window: 1s, policy: disconnect}
`, want: func(c Config) bool {
			return reflect.DeepEqual(c.Limits.Rules, []Rule{{
				Name:  "sensors",
				Match: Match{ClientID: "sensor-*", Username: "fleet-?"},
				Quota: Quota{Limit: 10, Window: Duration(time.Second), Policy: devicelimit.PolicyDisconnect},
			}})
		}},
		{name: "rule quota inherits default", yaml: `
limits:
  default: {limit: 50, window: 2s, policy: disconnect}
  rules:
    - match: {username: "a"}
      quota: {limit: 5}
    - match: {username: "b"}
`, want: func(c Config) bool {
			return reflect.DeepEqual(c.Limits.Rules[0].Quota, Quota{Limit: 5, Window: Duration(2 * time.Second), Policy: devicelimit.PolicyDisconnect}) &&
				reflect.DeepEqual(c.Limits.Rules[1].Quota, Quota{Limit: 50, Window: Duration(2 * time.Second), Policy: devicelimit.PolicyDisconnect})
		}},
		{name: "rules empty list", yaml: `limits: {rules: []}`, want: func(c Config) bool { return c.Limits.Rules == nil }},
		{name: "rule without match", yaml: `limits: {rules: [{quota: {limit: 1}}]}`, err: []string{`limits.rules[0].match: needs a client_id or username pattern`}},
		{name: "rule bad glob", yaml: `limits: {rules: [{match: {client_id: 'x\'}}]}`, err: []string{`limits.rules[0].match.client_id: trailing backslash in "x\\"`}},
		{name: "rule zero window", yaml: `limits: {rules: [{match: {username: u}}, {match: {username: v}, quota: {window: 0s}}]}`,
			err: []string{`limits.rules[1].quota.window: must be > 0 (got "0s")`}},
		{name: "rule zero limit", yaml: `limits: {rules: [{match: {username: u}, quota: {limit: 0}}]}`,
			err: []string{`limits.rules[0].quota.limit: must be between 1 and 1000000000 (got 0)`}},
		{name: "rule defer", yaml: `limits: {rules: [{match: {username: u}, quota: {policy: defer}}]}`,
			want: func(c Config) bool { return c.Limits.Rules[0].Quota.Policy == devicelimit.PolicyDefer }},
		{name: "rule bare window", yaml: `limits: {rules: [{match: {username: u}, quota: {window: 5}}]}`,
			err: []string{`limits.rules[0].quota.window: must be a duration like "10s" (got 5)`}},
		{name: "rule duplicate name", yaml: `limits: {rules: [{name: a, match: {username: u}}, {name: a, match: {username: v}}]}`,
			err: []string{`limits.rules[1].name: "a" is also the name of limits.rules[0]`}},
		{name: "rule name clashes with position", yaml: `limits: {rules: [{match: {username: u}}, {name: "#1", match: {username: v}}]}`,
			err: []string{`limits.rules[1].name: "#1" is also the name of limits.rules[0]`}},
		{name: "rules not a list", yaml: `limits: {rules: {match: {username: u}}}`, err: []string{`limits.rules: must be a list (got a mapping)`}},

		// log.level
		{name: "level debug", yaml: `log: {level: debug}`, want: func(c Config) bool { return c.Log.Level == slog.LevelDebug }},
		{name: "level warn", yaml: `log: {level: warn}`, want: func(c Config) bool { return c.Log.Level == slog.LevelWarn }},
		{name: "level error", yaml: `log: {level: error}`, want: func(c Config) bool { return c.Log.Level == slog.LevelError }},
		{name: "level upper case", yaml: `log: {level: INFO}`, want: func(c Config) bool { return c.Log.Level == slog.LevelInfo }},
		{name: "level verbose", yaml: `log: {level: verbose}`, err: []string{`log.level: must be debug, info, warn or error (got "verbose")`}},
		{name: "level empty", yaml: `log: {level: ""}`, err: []string{`log.level: must be debug, info, warn or error (got "")`}},

		// unknown keys, at every depth
		{name: "unknown top", yaml: "mqtt: {}\nauthz: {}\n", err: []string{`line 2: authz: unknown key; expected one of mqtt, admin, data_dir, persist, limits, log, cluster, forward, auth`}},
		{name: "unknown nested", yaml: "limits:\n  default:\n    burst: 5\n", err: []string{`line 3: limits.default.burst: unknown key; expected one of limit, window, policy`}},
		{name: "unknown in rule", yaml: `limits: {rules: [{match: {ip: "10.*"}}]}`, err: []string{`limits.rules[0].match.ip: unknown key; expected one of client_id, username`}},
		{name: "unknown odd key", yaml: "\"a.b\": 1\n", err: []string{`line 1: "a.b": unknown key`}},
		{name: "merge key", yaml: "limits:\n  <<: {buckets: 5}\n", err: []string{`limits."<<": merge keys (<<) are not supported`}},

		// aliases resolve like the values they name
		{name: "alias", yaml: "limits:\n  default: &q {limit: 3, window: 3s}\n  rules: [{match: {username: u}, quota: *q}]\n", want: func(c Config) bool {
			return reflect.DeepEqual(c.Limits.Rules[0].Quota, Quota{Limit: 3, Window: Duration(3 * time.Second), Policy: devicelimit.PolicyDrop})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := load(tt.yaml)
			if tt.err == nil {
				if err != nil {
					t.Fatalf("load: %v", err)
				}
				if !tt.want(c) {
					t.Fatalf("load gave %+v", c)
				}
				return
			}
			if err == nil {
				t.Fatalf("load succeeded with %+v, want error containing %q", c, tt.err)
			}
			for _, s := range tt.err {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
		})
	}
}

func TestValidateReportsEveryKey(t *testing.T) {
	c := Default()
	c.MQTT.TCP = "nope"
	c.DataDir = ""
	c.Persist.SnapshotInterval = 0
	c.Limits.Buckets = 0
	c.Limits.Default.Limit = 0
	c.Limits.Default.Window = 0
	c.Limits.Identity = 7       // no name stands for it
	c.Log.Level = slog.Level(3) // between info and warn: no name
	err := c.Validate()
	var keys []string
	for _, fe := range FieldErrors(err) {
		keys = append(keys, fe.Key)
	}
	// The limit and window share one check in devicelimit, which reports
	// the first bad field.
	want := []string{"mqtt.tcp", "data_dir", "persist.snapshot_interval", "limits.buckets", "limits.default.limit", "limits.identity", "log.level"}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("keys = %q, want %q (error: %v)", keys, want, err)
	}
}

func TestTooManyErrors(t *testing.T) {
	var b strings.Builder
	for i := range 30 {
		b.WriteString("k")
		b.WriteString(strings.Repeat("x", i))
		b.WriteString(": 1\n")
	}
	_, err := Parse(strings.NewReader(b.String()))
	if n := len(FieldErrors(err)); n != maxErrors {
		t.Fatalf("got %d field errors, want %d", n, maxErrors)
	}
	if !strings.Contains(err.Error(), "... and 10 more problems") {
		t.Fatalf("error %q does not count the rest", err)
	}
}

func TestParseSyntaxAndShape(t *testing.T) {
	tests := []struct{ yaml, err string }{
		{"limits: {default: [\n", "config: yaml:"},
		// Lines as an editor counts them (yaml.v3 prints a parser
		// error's 0-based).
		{"mqtt:\n  tcp: [oops\nadmin: {}\n", "config: yaml: line 2: did not find expected ',' or ']'"},
		{"mqtt:\n  tcp: \":1\"\n bad: 2\n", "config: yaml: line 3: did not find expected key"},
		{"mqtt:\n  tcp: \":1\"\n  x: \"unterminated\n", "config: yaml: line 3: found unexpected end of stream"},
		{"- 1\n- 2\n", "line 1: top level: must be a mapping of keys (got a list)"},
		{"mqtt: {}\n---\nlog: {}\n", "line 2: a second YAML document starts here"},
		{"limits: {buckets: 1, buckets: 2}\n", `mapping key "buckets" already defined`},
	}
	for _, tt := range tests {
		_, err := Parse(strings.NewReader(tt.yaml))
		if err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("Parse(%q) = %v, want error containing %q", tt.yaml, err, tt.err)
		}
	}
	_, err := Parse(strings.NewReader("# " + strings.Repeat("x", MaxSize)))
	if err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("Parse(huge) = %v, want size error", err)
	}
}

func TestDomainObjects(t *testing.T) {
	c, err := load(`
limits:
  default: {limit: 100, window: 10s}
  buckets: 10
  identity: username
  rules:
    - name: sensors
      match: {client_id: "sensor-*"}
      quota: {limit: 10, window: 1s}
    - match: {username: "bulk"}
      quota: {limit: 1000, policy: disconnect}
log: {level: warn}
`)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Resolver()
	if err != nil {
		t.Fatal(err)
	}
	if r.Buckets() != 10 {
		t.Fatalf("resolver buckets = %d, want 10", r.Buckets())
	}
	steps := []struct {
		clientID, username string
		quota              devicelimit.Quota
		source             string
	}{
		{"sensor-1", "bulk", devicelimit.Quota{Limit: 10, Window: time.Second}, "rule:sensors"},
		{"meter-1", "bulk", devicelimit.Quota{Limit: 1000, Window: 10 * time.Second, Policy: devicelimit.PolicyDisconnect}, "rule:#2"},
		{"meter-1", "other", devicelimit.Quota{Limit: 100, Window: 10 * time.Second}, "default"},
	}
	for _, s := range steps {
		q, src := r.Rule(s.clientID, s.username)
		if q != s.quota || src.String() != s.source {
			t.Errorf("Rule(%q, %q) = %v %v, want %v %v", s.clientID, s.username, q, src, s.quota, s.source)
		}
	}
	if id, err := c.Identity(); err != nil || id != devicelimit.IdentityUsername {
		t.Errorf("Identity() = %v, %v, want username", id, err)
	}
	if l, err := c.LogLevel(); err != nil || l != slog.LevelWarn {
		t.Errorf("LogLevel() = %v, %v, want WARN", l, err)
	}
	tab, err := c.Table()
	if err != nil || tab.Buckets() != 10 {
		t.Fatalf("Table() = %v, %v, want 10 buckets", tab, err)
	}

	bad := Default()
	bad.Limits.Buckets = 0 // NewTable would quietly take 0 as 20
	if _, err := bad.Table(); !errors.Is(err, devicelimit.ErrInvalidBuckets) {
		t.Errorf("Table() with 0 buckets = %v, want ErrInvalidBuckets", err)
	}
	bad = Default()
	bad.Limits.Default.Policy = 9
	if _, err := bad.Resolver(); err == nil || !strings.Contains(err.Error(), "limits.default.policy") {
		t.Errorf("Resolver() with policy hold = %v, want policy error", err)
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	c, err := load(`
mqtt: {tcp: "127.0.0.1:1999"}
data_dir: "/var/lib/device gate: \"x\""
persist: {snapshot_interval: 250ms}
limits:
  default: {limit: 5, window: 1m30s, policy: disconnect}
  buckets: 30
  rules: [{name: a, match: {client_id: "x*"}, quota: {limit: 1, window: 250ms}}]
`)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c)
}

// roundTrip checks that a valid configuration written back as YAML
// parses to itself and still validates.
func roundTrip(t *testing.T, c Config) {
	t.Helper()
	out, err := yaml.Marshal(c)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	c2, err := load(string(out))
	if err != nil {
		t.Fatalf("reloading %q: %v", out, err)
	}
	if !reflect.DeepEqual(c, c2) {
		t.Fatalf("round trip changed the config:\n got %+v\nwant %+v\nyaml:\n%s", c2, c, out)
	}
}
