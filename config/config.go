// Package config reads the gateway's YAML configuration.
//
// A configuration is built in three steps: Default, then Parse of a file
// (which starts from Default and changes only the keys the file sets),
// then Validate. Every key is optional and the defaults run out of the
// box. Keys this version does not implement are rejected as unknown
// rather than ignored, and every error names the full key and the bad
// value, for example:
//
//	limits.default.window: must be > 0 (got "0s")
//
// The schema:
//
//	mqtt:
//	  tcp: ":1883"                 # host:port of the MQTT TCP listener; "" turns it off
//	  tls:                         # MQTT over TLS (1.2 or later); off while addr is ""
//	    addr: ""                   # e.g. ":8883"
//	    cert_file: ""              # PEM certificate (chain) and key of the gateway
//	    key_file: ""
//	    client_ca_file: ""         # PEM CAs that sign device certificates: turns on certificate auth
//	  websocket:
//	    addr: ""                   # e.g. ":8083"; MQTT over WebSocket, off while ""
//	    tls: false                 # serve wss with mqtt.tls's certificate
//	  max_packet_size: 256KiB      # larger packets end the connection before they are read
//	  max_client_id_length: 256    # bytes
//	  max_connections: 50000       # clients connected at once; 0: no bound
//	  max_pending_writes: 64       # messages queued for one client (8 bytes each, every connection), 1..1048576
//	  consumers:                   # backend consumers: a write spool each, and publishers wait for them
//	    client_ids: []             # globs of their client IDs, e.g. ["backend-*"]
//	    write_buffer: 64MiB        # bytes the spool of one consumer holds, 64KiB..1GiB
//	  max_inflight: 8192           # QoS 1/2 messages sent to one client and not yet acknowledged, 1..65535
//	  max_pending_connections: 1000  # connections that have not sent CONNECT yet, all listeners, >= 1; over it the oldest is closed
//	  max_pending_per_address: 100   # those of one source IP address, >= 1; over it the address's oldest is closed
//	  connect_rate: {limit: 100, window: 1s, exempt: ["127.0.0.0/8", "::1/128"]}  # new connections per source IP (limit 0: off); exempt: CIDR prefixes not limited
//	  keepalive: {min: 0s, max: 1h}           # a keepalive outside is set to the bound; 0s: no bound
//	  topic_alias_maximum: 10      # highest MQTT 5 topic alias a client may use, 0..65535; 0: none
//	admin:
//	  addr: "127.0.0.1:8080"       # host:port of the admin HTTP API and /metrics
//	  token: ""                    # bearer token; empty: GATEWAY_ADMIN_TOKEN, else a token file in data_dir
//	  tls: {cert_file: "", key_file: ""}  # both set: HTTPS
//	  console: true                # the operator console at /ui/; false: off
//	data_dir: "./data"             # where the state file lives (created if missing)
//	persist:
//	  snapshot_interval: 1s        # how often changed windows are written, > 0 and <= 1h
//	  check_on_start: always       # the data file's consistency check: always, after_crash or never
//	  after_crash: charge          # charge (the quota holds across crashes) or forgive
//	  lease: {share: 0.1, min: 1, max: 1000} # what a crash may cost a window: a share of its limit
//	  min_free_bytes: 64MiB        # free-space floor: appends stop before the disk is full; 0: none
//	limits:
//	  default: {limit: 100, window: 10s, policy: drop}
//	  buckets: 20                  # buckets per window, 1..1000
//	  identity: client_id          # or username: which MQTT field names a device
//	  max_devices: 1000000         # devices with a live window; new ones beyond are refused at CONNECT
//	  rules:                       # first match wins, after runtime overrides
//	    - name: sensors            # optional, "#1", "#2"... by position
//	      match: {client_id: "sensor-*", username: "..."}  # globs, at least one
//	      quota: {limit: 10, window: 1s, policy: defer}
//	  defer:                       # bounds of the queues of policy defer
//	    max_messages_per_device: 1000
//	    max_bytes_per_device: 1MiB # bytes, or a string with B, KiB, MiB or GiB
//	    max_total_bytes: 256MiB    # all queues together
//	    max_age: 1h                # older queued messages are dropped, never released late
//	    restore_delay: 5s          # after a start, queued messages wait this long for consumers to reconnect
//	log:
//	  level: info                  # debug, info, warn or error
//	  format: text                 # text (key=value) or json (one object a line)
//	cluster:                       # absent: one gateway, state in data_dir only
//	  redis:
//	    addrs: ["redis.example:6379"] # host:port, one or more (several: Redis Cluster)
//	    username: ""               # ACL user, optional
//	    password: ""               # or GATEWAY_REDIS_PASSWORD
//	    tls: false                 # TLS to Redis, verified against the system roots
//	    db: 0                      # database number, 0..15; must be 0 with several addrs
//	    timeout: 50ms              # longest a decision waits for Redis
//	  failure_policy: local        # Redis down or slow: fail-open, fail-closed or local
//	  decisions: owner             # owner (decided where the device is; no policy defer) or redis (a script call per message)
//	  lease_share: 0.5             # owner: share of each window a gateway may admit past its last checkpoint
//	  gateway_ttl: 3s              # owner: a crashed gateway's devices are served elsewhere after this
//	auth:                          # allow-all while neither credentials_file nor mqtt.tls.client_ca_file is set
//	  credentials_file: ""         # accounts made with "gateway passwd"
//	  certificate_identity: cn     # cn, dns, email or uri: where a client certificate names its device
//	  acl:                         # topic templates of devices, {device} a whole level
//	    publish: "devices/{device}/#"
//	    subscribe: "devices/{device}/cmd/#"
//
// A rule's quota keys that are left out take their value from
// limits.default in the same file. Policies are drop, defer and
// disconnect.
//
// data_dir holds the gateway's state file (windows, quota overrides, the
// clock's high-water). A graceful shutdown writes everything; a crash
// loses at most persist.snapshot_interval of admissions, so a shorter
// interval bounds the loss more tightly at the cost of more writes.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/devicegate/devicegate/broker"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/persist"
)

// Config is the whole gateway configuration. The zero value is not
// valid; start from Default or Parse.
type Config struct {
	MQTT  MQTT  `yaml:"mqtt"`
	Admin Admin `yaml:"admin"`
	// DataDir is the directory of the state file; it is created (mode
	// 0700) if missing. Relative paths are relative to the working
	// directory.
	DataDir string  `yaml:"data_dir"`
	Persist Persist `yaml:"persist"`
	Limits  Limits  `yaml:"limits"`
	Log     Log     `yaml:"log"`
	// Cluster, when cluster.redis.addrs is set, shares device windows
	// and quota overrides between gateways in Redis.
	Cluster Cluster `yaml:"cluster"`
	// Forward lists the upstreams admitted messages are handed on to.
	Forward []Forward `yaml:"forward,omitempty"`
	// Auth turns on device authentication and the topic ACL; its zero
	// value lets every client in (allow-all).
	Auth Auth `yaml:"auth"`

	// badNames holds, by key, what was wrong with a name Parse read for
	// a typed field (a policy, the identity, the log level): the field
	// keeps its default and Validate reports the name with the other
	// problems, so that one run shows them all. nil when none.
	badNames map[string]string
	// mixed lists the quota keys that set windows beside limit or
	// window; Validate reports them.
	mixed []string
}

// MQTT configures the MQTT listeners.
type MQTT struct {
	// TCP is the host:port of the plain TCP listener; port 0 picks a
	// free port. Empty turns the plain listener off (then tls.addr or
	// websocket.addr must be set).
	TCP string `yaml:"tcp"`
	// TLS configures the MQTT over TLS listener.
	TLS TLS `yaml:"tls"`
	// WebSocket configures the MQTT over WebSocket listener.
	WebSocket WebSocket `yaml:"websocket"`
	// MaxPacketSize is the largest MQTT packet accepted; a client
	// announcing a larger one is disconnected before it is read.
	MaxPacketSize Size `yaml:"max_packet_size"`
	// MaxClientIDLength is the longest client ID accepted, in bytes.
	MaxClientIDLength int `yaml:"max_client_id_length"`
	// MaxConnections bounds the clients connected at once; 0: no bound.
	MaxConnections int `yaml:"max_connections"`
	// MaxPendingWrites bounds the messages queued for one slow client;
	// beyond it, messages to that client are dropped.
	MaxPendingWrites int `yaml:"max_pending_writes"`
	// Consumers names the backend consumers, which get a write spool
	// beyond the queue.
	Consumers Consumers `yaml:"consumers"`
	// MaxInflight bounds the QoS 1 and 2 messages sent to one client
	// and not yet acknowledged; beyond, messages to it are dropped.
	MaxInflight int `yaml:"max_inflight"`
	// MaxPendingConnections bounds the connections, on all listeners,
	// that have not sent CONNECT yet; over it the oldest is closed.
	MaxPendingConnections int `yaml:"max_pending_connections"`
	// MaxPendingPerAddress bounds those of one source IP address; over
	// it the address's oldest is closed.
	MaxPendingPerAddress int `yaml:"max_pending_per_address"`
	// ConnectRate bounds new connections per source IP address; a limit
	// of 0 turns it off.
	ConnectRate Rate `yaml:"connect_rate"`
	// Keepalive bounds the keepalive clients may ask for.
	Keepalive Keepalive `yaml:"keepalive"`
	// TopicAliasMaximum is the highest MQTT 5 topic alias a client may
	// use, announced in its CONNACK; 0: none.
	TopicAliasMaximum int `yaml:"topic_alias_maximum"`
}

// Admin configures the admin HTTP API, which also serves /metrics.
type Admin struct {
	// Addr is the host:port of the admin listener; port 0 picks a free
	// port. It defaults to loopback: the API changes quotas.
	Addr string `yaml:"addr"`
	// Token is the bearer token the /api routes require. When empty,
	// the gateway takes GATEWAY_ADMIN_TOKEN, or else reads (creating it
	// on first start) a token file in the data directory.
	Token string `yaml:"token"`
	// TLS, when its files are set, serves the admin API over HTTPS.
	TLS AdminTLS `yaml:"tls"`
	// Console serves the operator console at /ui/ on the admin
	// listener; false turns it off.
	Console bool `yaml:"console"`
}

// Persist configures how state reaches the data directory.
type Persist struct {
	// SnapshotInterval is how often the windows changed since the last
	// snapshot are written. It bounds what a crash can lose: at most one
	// interval of admissions.
	SnapshotInterval Duration `yaml:"snapshot_interval"`
	// CheckOnStart says when start-up runs the data file's consistency
	// check: "always", "after_crash" (only after an unclean shutdown) or
	// "never".
	CheckOnStart string `yaml:"check_on_start"`
	// AfterCrash says what a start after an unclean shutdown does about
	// the admissions the crash made it forget: "charge" (admissions are
	// acted on only under durable leases, and each window is charged
	// what its open lease could have admitted beyond the last snapshot,
	// at the latest instant it could have), or "forgive" them (no
	// leases).
	AfterCrash string `yaml:"after_crash"`
	// Lease sizes the leases that pay for crashes under "charge": an
	// admission is acted on only once a lease covering it is durable,
	// and a crash charges a window at most its open lease.
	Lease Lease `yaml:"lease"`
	// MinFreeBytes is the free-space floor of the data directory's
	// filesystem (persist.Options.MinFreeBytes): below it, counting the
	// data file's free pages, appends (forwarded messages, deferrals)
	// are refused or make room as forward overflow says, and /healthz
	// fails, before the disk is full. 0: no floor.
	MinFreeBytes Size `yaml:"min_free_bytes"`
}

// Lease is the size of a window's lease (devicelimit.LeasePolicy):
// Share of the window's limit, from Min to Max messages in a message
// window; Share of the bytes in a byte window.
type Lease struct {
	Share float64 `yaml:"share"`
	Min   int     `yaml:"min"`
	Max   int     `yaml:"max"`
}

// Policy returns the lease as a devicelimit.LeasePolicy.
func (l Lease) Policy() devicelimit.LeasePolicy {
	return devicelimit.LeasePolicy{Share: l.Share, Min: l.Min, Max: l.Max}
}

// DefaultMinFreeBytes is persist.min_free_bytes by default: room for
// a few of the store's largest transactions (16 MiB of records each,
// about twice that on disk) when the floor is reached.
const DefaultMinFreeBytes = 64 << 20

// MaxSnapshotInterval is the longest persist.snapshot_interval: beyond
// it a crash could hand devices most of an hour of extra quota.
const MaxSnapshotInterval = time.Hour

// Limits configures the per-device quotas.
type Limits struct {
	// Default is the quota of devices that no rule or override matches.
	Default Quota `yaml:"default"`
	// Buckets is the number of buckets each window is divided into.
	Buckets int `yaml:"buckets"`
	// Identity names the MQTT field that identifies a device:
	// client_id or username in YAML.
	Identity devicelimit.Identity `yaml:"identity"`
	// Rules give quotas to devices by client ID or username pattern;
	// the first match wins.
	Rules []Rule `yaml:"rules,omitempty"`
	// Classes are the topic classes of the devices no rule matches
	// (docs/quotas.md, "Topic classes").
	Classes []Class `yaml:"classes,omitempty"`
	// Group puts the devices no rule matches in a group.
	Group *Group `yaml:"group,omitempty"`
	// Defer bounds the queues of devices with policy defer.
	Defer Defer `yaml:"defer"`
	// MaxDevices bounds the devices with a live window; beyond it, new
	// devices are refused at CONNECT. 0: no bound.
	MaxDevices int `yaml:"max_devices"`
}

// Defer bounds the deferral queues: what is over a bound is handled as
// over the limit with policy drop.
type Defer struct {
	// MaxMessagesPerDevice bounds one device's queue in messages.
	MaxMessagesPerDevice int `yaml:"max_messages_per_device"`
	// MaxBytesPerDevice bounds one device's queue in payload bytes.
	MaxBytesPerDevice Size `yaml:"max_bytes_per_device"`
	// MaxTotalBytes bounds all queues together, so a flood cannot fill
	// the disk.
	MaxTotalBytes Size `yaml:"max_total_bytes"`
	// MaxAge drops a queued message older than this, never releasing it
	// late.
	MaxAge Duration `yaml:"max_age"`
	// RestoreDelay holds back, after a start, the release of the
	// messages queued before it, so backend consumers can reconnect
	// first: a message released to no subscriber is gone.
	RestoreDelay Duration `yaml:"restore_delay"`
}

// Quota is "Limit messages per Window", and the policy above it; or,
// instead of limit and window, several windows of messages or bytes
// (docs/quotas.md, "Several windows, bytes").
type Quota struct {
	// Limit and Window are left out of YAML written for a quota of
	// several windows (a spawned gateway's configuration), which may
	// not have both.
	Limit  int      `yaml:"limit,omitempty"`
	Window Duration `yaml:"window,omitempty"`
	// Policy is drop, defer or disconnect in YAML.
	Policy devicelimit.Policy `yaml:"policy"`
	// Windows, when set, are the quota's windows: a message is admitted
	// only when every one admits it.
	Windows []QuotaWindow `yaml:"windows,omitempty"`
	// Enforce false is shadow mode: decided and counted as if enforced,
	// the messages it would refuse pass (devicelimit.Quota.Shadow).
	Enforce *bool `yaml:"enforce,omitempty"`
	// Block blocks a device the quota refused After times within
	// Within, for For (devicelimit.Block).
	Block *Block `yaml:"block,omitempty"`
	// Feedback says when the quota's devices are told their standing
	// on MQTT 5 acknowledgements; nil: devicelimit.DefaultFeedback.
	Feedback *Feedback `yaml:"feedback,omitempty"`
}

// Block is automatic blocking in YAML: {after: 1000, within: 1m, for: 10m}.
type Block struct {
	After  int      `yaml:"after"`
	Within Duration `yaml:"within"`
	For    Duration `yaml:"for"`
}

// QuotaWindow is one window of a quota: at most Messages messages, or
// Bytes bytes of PUBLISH payload, in any interval of length Window.
type QuotaWindow struct {
	Messages int      `yaml:"messages,omitempty"`
	Bytes    Size     `yaml:"bytes,omitempty"`
	Window   Duration `yaml:"window"`
}

// Rule gives Quota to the devices that Match selects.
type Rule struct {
	// Name identifies the rule in logs and the admin API; "#N" (the
	// rule's 1-based position) when empty.
	Name  string `yaml:"name,omitempty"`
	Match Match  `yaml:"match"`
	Quota Quota  `yaml:"quota"`
	// Classes are the rule's topic classes: a message on a topic one of
	// them matches (the first) is counted under the class's quota, in
	// windows of its own per device.
	Classes []Class `yaml:"classes,omitempty"`
	// Group puts the rule's devices in a group (groups.go).
	Group *Group `yaml:"group,omitempty"`
}

// Class is a topic class: its name, topic filters and quota (limit and
// window, or windows; drop or disconnect).
type Class struct {
	Name   string   `yaml:"name"`
	Topics []string `yaml:"topics"`
	Quota  Quota    `yaml:"quota"`
}

// classes returns cs in devicelimit's terms.
func classes(cs []Class) []devicelimit.Class {
	if len(cs) == 0 {
		return nil
	}
	out := make([]devicelimit.Class, len(cs))
	for i, c := range cs {
		out[i] = devicelimit.Class{Name: c.Name, Topics: c.Topics, Quota: c.Quota.Quota()}
	}
	return out
}

// Match selects devices by globs over the MQTT client ID and username
// ('*' any run, '?' one byte, '\' escapes). An empty pattern matches
// anything; a rule needs at least one pattern, and with two both must
// match.
type Match struct {
	ClientID string `yaml:"client_id,omitempty"`
	Username string `yaml:"username,omitempty"`
}

// Log configures logging.
type Log struct {
	// Level is the lowest level logged: debug, info, warn or error in
	// YAML.
	Level slog.Level `yaml:"level"`
	// Format is how a log line is written: text (key=value, the
	// default) or json (one object a line, the same keys).
	Format string `yaml:"format"`
}

// Default returns the configuration used when no file or flag says
// otherwise: MQTT on :1883, the admin API on 127.0.0.1:8080, state in ./data with a snapshot every
// second, 100 messages per 10 s per device (dropped above), 20 buckets,
// devices named by client ID, info logging.
func Default() Config {
	return withSecurityDefaults(Config{
		MQTT:    MQTT{TCP: ":1883"},
		Admin:   Admin{Addr: "127.0.0.1:8080", Console: true},
		DataDir: "./data",
		Persist: Persist{SnapshotInterval: Duration(persist.DefaultInterval), CheckOnStart: "always", AfterCrash: "charge", MinFreeBytes: DefaultMinFreeBytes,
			Lease: Lease{Share: devicelimit.DefaultLeasePolicy.Share, Min: devicelimit.DefaultLeasePolicy.Min, Max: devicelimit.DefaultLeasePolicy.Max}},
		Limits: Limits{
			Default:  Quota{Limit: 100, Window: Duration(10 * time.Second), Policy: devicelimit.PolicyDrop},
			Buckets:  devicelimit.DefaultBuckets,
			Identity: devicelimit.IdentityClientID,
			Defer: Defer{
				MaxMessagesPerDevice: broker.DefaultDeferMaxMessagesPerDevice,
				MaxBytesPerDevice:    broker.DefaultDeferMaxBytesPerDevice,
				MaxTotalBytes:        broker.DefaultDeferMaxTotalBytes,
				MaxAge:               Duration(broker.DefaultDeferMaxAge),
				RestoreDelay:         Duration(5 * time.Second),
			},
		},
		Log: Log{Level: slog.LevelInfo, Format: "text"},
		Cluster: Cluster{
			Redis:         Redis{Timeout: Duration(DefaultRedisTimeout)},
			FailurePolicy: "local",
			Decisions:     "owner",
			LeaseShare:    DefaultLeaseShare,
			GatewayTTL:    Duration(DefaultGatewayTTL),
		},
	})
}

// Duration is a time.Duration written in YAML as a string that
// time.ParseDuration accepts, such as "10s" or "500ms". A bare number is
// an error: its unit would be a guess.
type Duration time.Duration

// String formats the duration like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalYAML writes the duration as a string such as "10s".
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// Quota returns the quota in devicelimit's terms. A window giving both
// or neither of messages and bytes is left for Validate to report (it
// is taken as bytes, or as 0 messages).
func (q Quota) Quota() devicelimit.Quota {
	shadow := q.Enforce != nil && !*q.Enforce
	var block devicelimit.Block
	if q.Block != nil {
		block = devicelimit.Block{After: q.Block.After, Within: time.Duration(q.Block.Within), For: time.Duration(q.Block.For)}
	}
	var fb devicelimit.Feedback
	if q.Feedback != nil {
		fb = q.Feedback.Feedback
	}
	if len(q.Windows) == 0 {
		return devicelimit.Quota{Limit: q.Limit, Window: time.Duration(q.Window), Policy: q.Policy, Shadow: shadow, Block: block, Feedback: fb}
	}
	ls := make([]devicelimit.Limit, len(q.Windows))
	for i, w := range q.Windows {
		ls[i] = devicelimit.Limit{Unit: devicelimit.Messages, N: w.Messages, Window: time.Duration(w.Window)}
		if w.Bytes != 0 {
			ls[i] = devicelimit.Limit{Unit: devicelimit.Bytes, N: int(w.Bytes), Window: time.Duration(w.Window)}
		}
	}
	dq := devicelimit.WithWindows(q.Policy, ls...)
	dq.Shadow, dq.Block, dq.Feedback = shadow, block, fb
	if len(ls) > devicelimit.MaxWindows {
		dq.NWindows = len(ls) // refused by Validate, naming the count
	}
	return dq
}

// RuleName returns the name of the i'th rule (0-based): its Name, or
// "#i+1" when it has none. The resolver and Validate use the same names.
func (l Limits) RuleName(i int) string {
	if l.Rules[i].Name != "" {
		return l.Rules[i].Name
	}
	return fmt.Sprintf("#%d", i+1)
}

// Resolver builds the quota resolver of the default quota and rules.
func (c Config) Resolver() (*devicelimit.Resolver, error) {
	// The quotas' own check first, so that an error names the key.
	check := func(key string, q Quota) error {
		var fe *devicelimit.FieldError
		if err := q.Quota().Validate(c.Limits.Buckets); errors.As(err, &fe) && fe.Field != "buckets" {
			return fmt.Errorf("%s.%s: %s", key, fe.Field, fe.Msg)
		}
		return nil
	}
	if err := check("limits.default", c.Limits.Default); err != nil {
		return nil, err
	}
	rules := make([]devicelimit.Rule, len(c.Limits.Rules))
	for i, r := range c.Limits.Rules {
		if err := check(fmt.Sprintf("limits.rules[%d].quota", i), r.Quota); err != nil {
			return nil, err
		}
		rules[i] = devicelimit.Rule{Name: c.Limits.RuleName(i), ClientID: r.Match.ClientID, Username: r.Match.Username, Quota: r.Quota.Quota(),
			Classes: classes(r.Classes), Group: r.Group.group()}
	}
	res, err := devicelimit.NewResolver(c.Limits.Default.Quota(), rules, c.Limits.Buckets)
	if err == nil {
		err = res.SetDefaultClasses(classes(c.Limits.Classes))
	}
	if err == nil {
		err = res.SetDefaultGroup(c.Limits.Group.group())
	}
	return res, err
}

// Table returns an empty window table with the configured bucket count.
func (c Config) Table() (*devicelimit.Table, error) {
	if err := validBuckets(c.Limits.Buckets); err != nil {
		return nil, err
	}
	t, err := devicelimit.NewTable(c.Limits.Buckets)
	if err != nil {
		return nil, err
	}
	if c.Persist.AfterCrash == "charge" {
		if err := c.Persist.Lease.Policy().Validate(); err != nil {
			return nil, err
		}
		t.EnableLeases(c.Persist.Lease.Policy())
	}
	return t, nil
}

// Identity returns which MQTT field names a device; an error for a
// value no name stands for (set in code, not read from YAML).
func (c Config) Identity() (devicelimit.Identity, error) {
	if _, err := c.Limits.Identity.MarshalText(); err != nil {
		return 0, err
	}
	return c.Limits.Identity, nil
}

// LogLevel returns the configured slog level; an error for a level
// other than debug, info, warn and error (set in code, not read from
// YAML).
func (c Config) LogLevel() (slog.Level, error) {
	if _, err := ParseLevel(LevelName(c.Log.Level)); err != nil {
		return 0, err
	}
	return c.Log.Level, nil
}

// LevelName is the configuration's name of a level: debug, info, warn
// or error.
func LevelName(l slog.Level) string { return strings.ToLower(l.String()) }

var levels = map[string]slog.Level{
	"debug": slog.LevelDebug,
	"info":  slog.LevelInfo,
	"warn":  slog.LevelWarn,
	"error": slog.LevelError,
}

// ParseLevel returns the level named s (any case): debug, info, warn or
// error. Its error says what is expected.
func ParseLevel(s string) (slog.Level, error) {
	if l, ok := levels[strings.ToLower(s)]; ok {
		return l, nil
	}
	return 0, fmt.Errorf("must be debug, info, warn or error (got %q)", s)
}

// ParsePolicy returns the policy named s: drop, defer or disconnect.
// Its error says what is expected, without devicelimit's sentinel.
func ParsePolicy(s string) (devicelimit.Policy, error) {
	p, err := devicelimit.ParsePolicy(s)
	if err != nil {
		return 0, fmt.Errorf("must be drop, defer or disconnect (got %q)", s)
	}
	return p, nil
}
