package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// Forward is one upstream the gateway hands admitted messages on to
// (docs/forwarding.md, "MQTT upstream").
type Forward struct {
	// Name names the upstream in logs and its forward log; unique.
	Name string `yaml:"name"`
	// To is the destination; its scheme is its kind (Kind): an MQTT
	// broker (mqtt://host:port, mqtts:// over TLS), Redis Streams
	// (redis://host:port[/DB], rediss://), NATS JetStream
	// (nats://host:port[,host:port...], natss://) or Kafka
	// (kafka://host:port[,host:port...], kafkas://). The schemes ending
	// in s are over TLS, with TLS's files.
	To string `yaml:"to"`
	// Topics are the local topic filters whose messages go upstream.
	Topics []string `yaml:"topics"`
	// LocalPrefix, when a topic starts with it, becomes RemotePrefix
	// upstream.
	LocalPrefix  string `yaml:"local_prefix,omitempty"`
	RemotePrefix string `yaml:"remote_prefix,omitempty"`
	// MaxQoS bounds the QoS upstream: 0 or 1 (1 when the file does not
	// say; with 0 a message leaves the forward log once written to the
	// connection, and an outage can lose it).
	MaxQoS int `yaml:"max_qos"`
	// ClientID upstream; default devicegate-HOST-NAME.
	ClientID string `yaml:"client_id,omitempty"`
	// MaxBytes bounds the upstream's forward log (record bytes); 0: no
	// bound. Overflow says what happens beyond: drop_oldest (the
	// default) or refuse_new.
	MaxBytes Size   `yaml:"max_bytes,omitempty"`
	Overflow string `yaml:"overflow,omitempty"`
	// Subscribe lists upstream topic filters whose messages are
	// published to the local subscribers, under the reverse prefix
	// mapping (commands to devices); counted against no quota.
	Subscribe []string `yaml:"subscribe,omitempty"`
	// Username and Password log in upstream; the password may instead
	// come from a file (its first line) or an environment variable.
	Username     string `yaml:"username,omitempty"`
	Password     string `yaml:"password,omitempty"`
	PasswordFile string `yaml:"password_file,omitempty"`
	PasswordEnv  string `yaml:"password_env,omitempty"`
	// TLS holds the files of an mqtts:// upstream.
	TLS ForwardTLS `yaml:"tls,omitempty"`
	// MQTTVersion is the upstream protocol: "3.1.1" (the default) or
	// "5" (the messages' MQTT 5 properties are carried).
	MQTTVersion string `yaml:"mqtt_version,omitempty"`
	// Connections is the number of upstream connections (default 1); a
	// device always goes through the same one.
	Connections int `yaml:"connections,omitempty"`
	// MaxInflight is the most messages a connection has sent and the
	// destination not yet acknowledged (Inflight: default 100 for an
	// MQTT upstream, 1000 for a stream).
	MaxInflight int `yaml:"max_inflight,omitempty"`
	// Rate bounds the messages sent per second on each connection
	// (backlog and live together); no bound when not given.
	Rate *float64 `yaml:"rate,omitempty"`
	// MaxAge drops a message older than this when its turn to be sent
	// comes (counted, never sent late); 0: no bound.
	MaxAge Duration `yaml:"max_age,omitempty"`
	// KeepAlive is the upstream connection's MQTT keepalive (default
	// 30s).
	KeepAlive Duration `yaml:"keepalive,omitempty"`
	// MaxBackoff is the longest wait between two attempts to connect
	// to the destination (the wait starts at 100 ms and doubles, with
	// jitter); 0: forward.DefaultMaxBackoff.
	MaxBackoff Duration `yaml:"max_backoff,omitempty"`
	// DeadAfterCloses sets a message aside with the dead letters
	// (reason connection_closed) once the destination closed that many
	// connections in a row with it the oldest unacknowledged: an upstream
	// that closes the connection instead of refusing a message would
	// otherwise get it again on every connection. Nil: 3; 0: never.
	DeadAfterCloses *int `yaml:"dead_after_closes,omitempty"`
	// Stream names the Redis stream of a message for a redis://
	// destination: {topic} and {device} stand for its MQTT topic and
	// device; "{topic}" when empty.
	Stream string `yaml:"stream,omitempty"`
	// MaxLen trims each Redis stream to about this many entries
	// (XADD MAXLEN ~); 0: no bound.
	MaxLen int `yaml:"max_len,omitempty"`
	// Subject names the NATS subject of a message: {topic} (its MQTT
	// topic, levels made tokens) and {device}; "{topic}" when empty.
	Subject string `yaml:"subject,omitempty"`
	// CredsFile is a NATS credentials file (JWT and NKey seed).
	CredsFile string `yaml:"creds_file,omitempty"`
	// KafkaTopic names the Kafka topic of a message: {topic} and
	// {device} (made topic-name characters) and fixed text; required.
	KafkaTopic string `yaml:"kafka_topic,omitempty"`
	// SASL is the Kafka SASL mechanism: PLAIN, SCRAM-SHA-256 or
	// SCRAM-SHA-512, with username and a password; none when empty.
	SASL string `yaml:"sasl,omitempty"`
	// PersistentSession asks the upstream to keep the connection's
	// session (clean session false): its subscribe: filters, and the
	// commands published while the gateway was away.
	PersistentSession bool `yaml:"persistent_session,omitempty"`
	// Adopt names former entries (renamed or removed) whose forward
	// logs this entry sends, each on a connection of its own, so that
	// their backlog is not stranded; a log of no entry stops the start.
	Adopt []string `yaml:"adopt,omitempty"`
}

// ForwardTLS holds the PEM files of a TLS upstream connection.
type ForwardTLS struct {
	// CAFile holds the CAs the upstream's certificate is checked
	// against; the system's when empty.
	CAFile string `yaml:"ca_file,omitempty"`
	// CertFile and KeyFile are the gateway's client certificate and key
	// (mutual TLS, as AWS IoT Core requires).
	CertFile string `yaml:"cert_file,omitempty"`
	KeyFile  string `yaml:"key_file,omitempty"`
	// ServerName is the name the upstream's certificate must carry;
	// to's host when empty.
	ServerName string `yaml:"server_name,omitempty"`
}

// MaxForwardConnections bounds forward[].connections.
const MaxForwardConnections = 64

// schemes maps each scheme of to to its destination kind.
var schemes = map[string]string{"mqtt": "mqtt", "mqtts": "mqtt", "redis": "redis", "rediss": "redis",
	"nats": "nats", "natss": "nats", "kafka": "kafka", "kafkas": "kafka"}

// scheme returns to's scheme in lower case ("" when it has none):
// schemes are case-insensitive (RFC 3986, 3.1), "MQTT://" is "mqtt://".
func (f Forward) scheme() string {
	s, _, _ := strings.Cut(f.To, "://")
	return strings.ToLower(s)
}

// afterScheme returns what follows to's "scheme://".
func afterScheme(to string) string {
	if _, rest, ok := strings.Cut(to, "://"); ok {
		return rest
	}
	return to
}

// Kind is the destination's kind, from to's scheme: "mqtt", "redis",
// "nats" or "kafka" ("" for an unknown scheme).
func (f Forward) Kind() string { return schemes[f.scheme()] }

// Secure reports whether the destination is reached over TLS (its
// scheme is the kind's name with an s added).
func (f Forward) Secure() bool {
	switch f.scheme() {
	case "mqtts", "rediss", "natss", "kafkas":
		return true
	}
	return false
}

// Secret returns the upstream password: password, the first line of
// password_file, or the environment variable password_env. The error
// names the key.
func (f Forward) Secret(getenv func(string) string, readFile func(string) ([]byte, error)) (string, error) {
	switch {
	case f.PasswordFile != "":
		b, err := readFile(f.PasswordFile)
		if err != nil {
			return "", fmt.Errorf("password_file: %w", err)
		}
		line, _, _ := strings.Cut(string(b), "\n")
		return strings.TrimSuffix(line, "\r"), nil
	case f.PasswordEnv != "":
		v := getenv(f.PasswordEnv)
		if v == "" {
			return "", fmt.Errorf("password_env: the environment variable %s is not set", f.PasswordEnv)
		}
		return v, nil
	}
	return f.Password, nil
}

// Addr returns the destination's host:port from To, which must be
// valid (the first of several).
func (f Forward) Addr() string { return f.Hosts()[0] }

// Hosts returns the destination's host:port list from To, which must
// be valid.
func (f Forward) Hosts() []string {
	rest := afterScheme(f.To)
	hosts, _, _ := strings.Cut(rest, "/")
	return strings.Split(hosts, ",")
}

// forward checks the forward list.
func (v *validator) forward(list []Forward) {
	names := map[string]bool{}
	for _, f := range list {
		names[f.Name] = false
	}
	adopted := map[string]bool{}
	for i, f := range list {
		for j, a := range f.Adopt {
			key := fmt.Sprintf("forward[%d].adopt[%d]", i, j)
			_, configured := names[a]
			switch {
			case a == "" || len(a) > 64 || strings.ContainsAny(a, "/\x00"):
				v.add(key, fmt.Sprintf("must be a former entry's name, 1 to 64 bytes without '/' (got %q)", a))
			case configured:
				v.add(key, fmt.Sprintf("%q is an entry of forward: (its logs are its own)", a))
			case adopted[a]:
				v.add(key, fmt.Sprintf("%q is adopted twice", a))
			}
			adopted[a] = true
		}
	}
	names = map[string]bool{}
	for i, f := range list {
		key := fmt.Sprintf("forward[%d]", i)
		switch {
		case f.Name == "" || len(f.Name) > 64 || strings.ContainsAny(f.Name, "/\x00"):
			v.add(key+".name", fmt.Sprintf("must be 1 to 64 bytes without '/' (got %q)", f.Name))
		case names[f.Name]:
			v.add(key+".name", fmt.Sprintf("%q names two upstreams", f.Name))
		}
		names[f.Name] = true
		if msg := destination(f.To); msg != "" {
			v.add(key+".to", msg)
		} else {
			v.kindKeys(key, f)
		}
		if f.MaxLen < 0 {
			v.add(key+".max_len", fmt.Sprintf("must be >= 0, 0 for no bound (got %d)", f.MaxLen))
		}
		if !f.Secure() && f.TLS != (ForwardTLS{}) {
			v.add(key+".tls", fmt.Sprintf("is for a destination over TLS: mqtts://, rediss://, natss:// or kafkas:// (to is %q)", f.To))
		}
		if (f.TLS.CertFile == "") != (f.TLS.KeyFile == "") {
			v.add(key+".tls.key_file", fmt.Sprintf("cert_file and key_file go together (got %q and %q)", f.TLS.CertFile, f.TLS.KeyFile))
		}
		set := 0
		for _, p := range []string{f.Password, f.PasswordFile, f.PasswordEnv} {
			if p != "" {
				set++
			}
		}
		if set > 1 {
			v.add(key+".password", "give one of password, password_file and password_env")
		}
		if set > 0 && f.Username == "" {
			v.add(key+".username", "a password needs a username")
		}
		if f.CredsFile != "" && f.Username != "" {
			v.add(key+".creds_file", "give either creds_file or username and a password")
		}
		if f.MQTTVersion != "" && f.MQTTVersion != "3.1.1" && f.MQTTVersion != "5" {
			v.add(key+".mqtt_version", fmt.Sprintf("must be \"3.1.1\" or \"5\" (got %q)", f.MQTTVersion))
		}
		if f.Connections < 0 || f.Connections > MaxForwardConnections {
			v.add(key+".connections", fmt.Sprintf("must be 1 to %d (got %d)", MaxForwardConnections, f.Connections))
		}
		if f.MaxInflight < 0 || f.MaxInflight > 65535 {
			v.add(key+".max_inflight", fmt.Sprintf("must be 1 to 65535, or 0 for the default (got %d)", f.MaxInflight))
		}
		if f.Rate != nil && !(*f.Rate > 0 && *f.Rate <= 1e9) {
			v.add(key+".rate", fmt.Sprintf("must be > 0 messages per second, or left out for no bound (got %g)", *f.Rate))
		}
		if f.MaxAge < 0 {
			v.add(key+".max_age", fmt.Sprintf("must be >= 0, 0 for no bound (got %s)", f.MaxAge))
		}
		if f.KeepAlive < 0 || f.KeepAlive > 0 && time.Duration(f.KeepAlive) < time.Second || time.Duration(f.KeepAlive) > 18*time.Hour {
			v.add(key+".keepalive", fmt.Sprintf("must be 1s to 18h, or 0 for 30s (got %s)", f.KeepAlive))
		}
		if f.MaxBackoff < 0 || f.MaxBackoff > 0 && time.Duration(f.MaxBackoff) < time.Second || time.Duration(f.MaxBackoff) > time.Hour {
			v.add(key+".max_backoff", fmt.Sprintf("must be 1s to 1h, or 0 for 10s (got %s)", f.MaxBackoff))
		}
		if n := f.DeadAfterCloses; n != nil && (*n < 0 || *n > MaxDeadAfterCloses) {
			v.add(key+".dead_after_closes", fmt.Sprintf("must be 1 to %d, or 0 for never (got %d)", MaxDeadAfterCloses, *n))
		}
		if len(f.Topics) == 0 {
			v.add(key+".topics", "must list at least one topic filter")
		}
		for j, t := range f.Topics {
			if msg := topicFilter(t); msg != "" {
				v.add(fmt.Sprintf("%s.topics[%d]", key, j), msg)
			}
		}
		for j, s := range f.Subscribe {
			if msg := topicFilter(s); msg != "" {
				v.add(fmt.Sprintf("%s.subscribe[%d]", key, j), msg)
			}
		}
		if msg := prefixMapping(f.LocalPrefix, f.RemotePrefix); msg != "" {
			v.add(key+".remote_prefix", msg)
		}
		if f.MaxBytes < 0 {
			v.add(key+".max_bytes", fmt.Sprintf("must be >= 0, 0 for no bound (got %d)", f.MaxBytes))
		}
		if f.Overflow != "" && f.Overflow != "drop_oldest" && f.Overflow != "refuse_new" {
			v.add(key+".overflow", fmt.Sprintf("must be drop_oldest or refuse_new (got %q)", f.Overflow))
		}
		if f.MaxQoS < 0 || f.MaxQoS > 1 {
			v.add(key+".max_qos", fmt.Sprintf("must be 0 or 1 (got %d)", f.MaxQoS))
		}
	}
}

// prefixMapping checks a topic mapping: both prefixes or neither, each
// whole levels (ending in '/'), without wildcards, not a '$' topic, so
// that every mapped topic maps back to itself.
func prefixMapping(local, remote string) string {
	switch {
	case local == "" && remote == "":
		return ""
	case local == "" || remote == "":
		return fmt.Sprintf("local_prefix and remote_prefix go together (got %q and %q)", local, remote)
	case strings.ContainsAny(local+remote, "+#\x00") || strings.HasPrefix(local, "$") || strings.HasPrefix(remote, "$"):
		return fmt.Sprintf("local_prefix and remote_prefix take no wildcards and no '$' start (got %q and %q)", local, remote)
	case !strings.HasSuffix(local, "/") || !strings.HasSuffix(remote, "/"):
		return fmt.Sprintf("local_prefix and remote_prefix must end in '/' so the mapping is of whole levels and can be reversed (got %q and %q)", local, remote)
	}
	return ""
}

// destination checks to: a known scheme, then host:port (several,
// comma-separated, for nats and kafka), then for redis an optional
// database.
func destination(s string) string {
	const want = "must be mqtt[s]://host:port, redis[s]://host:port[/DB], nats[s]://host:port[,host:port...] or kafka[s]://host:port[,host:port...]"
	f := Forward{To: s}
	kind := f.Kind()
	if kind == "" {
		return fmt.Sprintf("%s: unknown kind of destination %q (got %q)", want, f.scheme(), s)
	}
	rest := afterScheme(s)
	hosts, path, _ := strings.Cut(rest, "/")
	switch {
	case kind == "redis":
		if path != "" {
			if n, err := strconv.Atoi(path); err != nil || n < 0 || n > 15 {
				return fmt.Sprintf("the database after the address must be 0 to 15 (got %q)", s)
			}
		}
	case path != "" || strings.HasSuffix(rest, "/") && kind != "mqtt":
		return fmt.Sprintf("%s (got %q)", want, s)
	}
	list := strings.Split(hosts, ",")
	if len(list) > 1 && kind != "nats" && kind != "kafka" {
		return fmt.Sprintf("%s: one host:port for %s (got %q)", want, kind, s)
	}
	if strings.Contains(hosts, "@") {
		return fmt.Sprintf("must be %s://host:port: credentials go in username and a password key, not in to (got %q)", f.scheme(), s)
	}
	for _, h := range list {
		host, port, err := net.SplitHostPort(h)
		if err != nil || host == "" || port == "" || strings.ContainsAny(h, "@?#") {
			return fmt.Sprintf("must be %s://host:port, with the port (got %q)", f.scheme(), s)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Sprintf("port must be 1 to 65535 (got %q)", s)
		}
	}
	return ""
}

// MaxDeadAfterCloses bounds forward[].dead_after_closes.
const MaxDeadAfterCloses = 1000

// DefaultDeadAfterCloses is forward[].dead_after_closes when not given.
const DefaultDeadAfterCloses = 3

// Closes returns dead_after_closes, or its default when not given (0:
// never).
func (f Forward) Closes() int {
	if f.DeadAfterCloses == nil {
		return DefaultDeadAfterCloses
	}
	return *f.DeadAfterCloses
}

// Inflight returns max_inflight, or its default when not given: 100 for
// an MQTT upstream (brokers bound what a client has in flight: Mosquitto
// queues beyond 20, AWS IoT Core's connections take 100 a second), 1000
// for a stream, whose clients pipeline (with 100, a round trip per 100
// messages held each stream below the rate devices publish at in
// `make bench-forward`).
func (f Forward) Inflight() int {
	switch {
	case f.MaxInflight > 0:
		return f.MaxInflight
	case f.Kind() == "mqtt":
		return 100
	}
	return 1000
}

// RedisDB is the Redis database of a redis:// destination (0 when not
// given); to must be valid.
func (f Forward) RedisDB() int {
	_, db, _ := strings.Cut(afterScheme(f.To), "/")
	n, _ := strconv.Atoi(db)
	return n
}

// kindKeys refuses the keys of other kinds of destination and checks
// the templates and SASL of f's kind, whose to is valid.
func (v *validator) kindKeys(key string, f Forward) {
	kind := f.Kind()
	for _, k := range []struct {
		name, kind string
		set        bool
	}{
		{"subscribe", "mqtt", len(f.Subscribe) > 0},
		{"mqtt_version", "mqtt", f.MQTTVersion != ""},
		{"keepalive", "mqtt", f.KeepAlive != 0},
		{"persistent_session", "mqtt", f.PersistentSession},
		{"client_id", "mqtt", f.ClientID != ""},
		{"local_prefix", "mqtt", f.LocalPrefix != ""},
		{"stream", "redis", f.Stream != ""},
		{"max_len", "redis", f.MaxLen != 0},
		{"subject", "nats", f.Subject != ""},
		{"creds_file", "nats", f.CredsFile != ""},
		{"kafka_topic", "kafka", f.KafkaTopic != ""},
		{"sasl", "kafka", f.SASL != ""},
	} {
		if k.set && k.kind != kind {
			v.add(key+"."+k.name, fmt.Sprintf("is for %s destinations; to is %q", kindNames[k.kind], f.To))
		}
	}
	switch kind {
	case "redis":
		if msg := template(f.Stream, func(rune) bool { return true }); msg != "" {
			v.add(key+".stream", fmt.Sprintf("%s (got %q)", msg, f.Stream))
		}
	case "nats":
		if msg := template(f.Subject, subjectRune); msg != "" {
			v.add(key+".subject", fmt.Sprintf("%s (got %q)", msg, f.Subject))
		} else if fixed := strings.NewReplacer("{topic}", "t", "{device}", "d").Replace(f.Subject); f.Subject != "" &&
			(strings.HasPrefix(fixed, ".") || strings.HasSuffix(fixed, ".") || strings.Contains(fixed, "..")) {
			v.add(key+".subject", fmt.Sprintf("must not have an empty token: no leading, trailing or double '.' (got %q)", f.Subject))
		}
	case "kafka":
		if f.KafkaTopic == "" {
			v.add(key+".kafka_topic", "must name the Kafka topic: fixed text, {topic} and {device} (got \"\")")
		} else if msg := template(f.KafkaTopic, kafkaRune); msg != "" {
			v.add(key+".kafka_topic", fmt.Sprintf("%s (got %q)", msg, f.KafkaTopic))
		} else if len(f.KafkaTopic) > 249 {
			v.add(key+".kafka_topic", fmt.Sprintf("must be at most 249 bytes (got %d)", len(f.KafkaTopic)))
		}
		switch f.SASL {
		case "", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		default:
			v.add(key+".sasl", fmt.Sprintf("must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (got %q)", f.SASL))
		}
		if (f.SASL != "") != (f.Username != "") {
			v.add(key+".sasl", fmt.Sprintf("a SASL mechanism and a username go together (got sasl %q, username %q)", f.SASL, f.Username))
		}
	}
}

// kindNames names the schemes of each kind in messages.
var kindNames = map[string]string{"mqtt": "mqtt:// and mqtts://", "redis": "redis:// and rediss://",
	"nats": "nats:// and natss://", "kafka": "kafka:// and kafkas://"}

// template checks a destination name template: braces only around
// {topic} and {device}, and every other character one ok accepts.
func template(tmpl string, ok func(rune) bool) string {
	fixed := strings.NewReplacer("{topic}", "", "{device}", "").Replace(tmpl)
	if strings.ContainsAny(fixed, "{}") {
		return "may hold {topic} and {device}, nothing else in braces"
	}
	for _, r := range fixed {
		if !ok(r) {
			return fmt.Sprintf("must not hold %q", r)
		}
	}
	return ""
}

// subjectRune reports whether a NATS subject's fixed text may hold r:
// not a wildcard (NATS '*' and '>', nor MQTT '+' and '#'), not white
// space.
func subjectRune(r rune) bool { return !strings.ContainsRune("*>+# \t\r\n/", r) }

// kafkaRune reports whether a Kafka topic name may hold r.
func kafkaRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
}

// topicFilter checks an MQTT topic filter (devicelimit.ValidFilter).
func topicFilter(f string) string { return devicelimit.ValidFilter(f) }
