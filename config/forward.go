package config

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Forward is one upstream the gateway hands admitted messages on to
// (README, "Forwarding upstream").
type Forward struct {
	// Name names the upstream in logs and its forward log; unique.
	Name string `yaml:"name"`
	// To is the upstream broker: mqtt://host:port (MQTT 3.1.1 over
	// TCP) or mqtts://host:port (over TLS, see TLS).
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
	// upstream not yet acknowledged (default 100).
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
	// Stream names the Redis stream of a message for a redis://
	// destination: {topic} and {device} stand for its MQTT topic and
	// device; "{topic}" when empty.
	Stream string `yaml:"stream,omitempty"`
	// MaxLen trims each Redis stream to about this many entries
	// (XADD MAXLEN ~); 0: no bound.
	MaxLen int `yaml:"max_len,omitempty"`
	// PersistentSession asks the upstream to keep the connection's
	// session (clean session false): its subscribe: filters, and the
	// commands published while the gateway was away.
	PersistentSession bool `yaml:"persistent_session,omitempty"`
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

// Secure reports whether the upstream is reached over TLS (mqtts://).
func (f Forward) Secure() bool { return strings.HasPrefix(f.To, "mqtts://") }

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

// Addr returns the upstream's host:port from To, which must be valid.
func (f Forward) Addr() string {
	u, _ := url.Parse(f.To)
	return u.Host
}

// forward checks the forward list.
func (v *validator) forward(list []Forward) {
	names := map[string]bool{}
	for i, f := range list {
		key := fmt.Sprintf("forward[%d]", i)
		switch {
		case f.Name == "" || len(f.Name) > 64 || strings.ContainsAny(f.Name, "/\x00"):
			v.add(key+".name", fmt.Sprintf("must be 1 to 64 bytes without '/' (got %q)", f.Name))
		case names[f.Name]:
			v.add(key+".name", fmt.Sprintf("%q names two upstreams", f.Name))
		}
		names[f.Name] = true
		if msg := upstreamURL(f.To); msg != "" {
			v.add(key+".to", msg)
		}
		v.kindKeys(key, f)
		if f.MaxLen < 0 {
			v.add(key+".max_len", fmt.Sprintf("must be >= 0, 0 for no bound (got %d)", f.MaxLen))
		}
		secure := f.Secure()
		if !secure && f.TLS != (ForwardTLS{}) {
			v.add(key+".tls", fmt.Sprintf("is for an mqtts:// upstream (to is %q)", f.To))
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
		if f.MQTTVersion != "" && f.MQTTVersion != "3.1.1" && f.MQTTVersion != "5" {
			v.add(key+".mqtt_version", fmt.Sprintf("must be \"3.1.1\" or \"5\" (got %q)", f.MQTTVersion))
		}
		if f.Connections < 0 || f.Connections > MaxForwardConnections {
			v.add(key+".connections", fmt.Sprintf("must be 1 to %d (got %d)", MaxForwardConnections, f.Connections))
		}
		if f.MaxInflight < 0 || f.MaxInflight > 65535 {
			v.add(key+".max_inflight", fmt.Sprintf("must be 1 to 65535, or 0 for 100 (got %d)", f.MaxInflight))
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

// upstreamURL checks an upstream address: mqtt://host:port,
// mqtts://host:port or redis://host:port[/DB].
func upstreamURL(s string) string {
	const want = "must be mqtt://host:port, mqtts://host:port or redis://host:port[/DB]"
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" {
		return fmt.Sprintf("%s (got %q)", want, s)
	}
	switch u.Scheme {
	case "mqtt", "mqtts":
		if u.Path != "" && u.Path != "/" {
			return fmt.Sprintf("%s (got %q)", want, s)
		}
	case "redis":
		if db := strings.TrimPrefix(u.Path, "/"); db != "" {
			if n, err := strconv.Atoi(db); err != nil || n < 0 || n > 15 {
				return fmt.Sprintf("the database after the address must be 0 to 15 (got %q)", s)
			}
		}
	default:
		return fmt.Sprintf("%s (got %q)", want, s)
	}
	if _, port, err := net.SplitHostPort(u.Host); err != nil || port == "" {
		return fmt.Sprintf("must be %s://host:port, with the port (got %q)", u.Scheme, s)
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Sprintf("port must be 1 to 65535 (got %q)", s)
	}
	return ""
}

// Kind is the destination's kind, from to's scheme: "mqtt" (mqtt:// and
// mqtts://) or "redis" (Redis Streams).
func (f Forward) Kind() string {
	if strings.HasPrefix(f.To, "redis://") {
		return "redis"
	}
	return "mqtt"
}

// RedisDB is the Redis database of a redis:// destination (0 when not
// given); to must be valid.
func (f Forward) RedisDB() int {
	u, _ := url.Parse(f.To)
	n, _ := strconv.Atoi(strings.TrimPrefix(u.Path, "/"))
	return n
}

// kindKeys refuses the keys of the other kind of destination.
func (v *validator) kindKeys(key string, f Forward) {
	set := func(name string, isSet bool) {
		if isSet {
			v.add(key+"."+name, fmt.Sprintf("is for an MQTT upstream; to is %q", f.To))
		}
	}
	if f.Kind() == "redis" {
		set("subscribe", len(f.Subscribe) > 0)
		set("mqtt_version", f.MQTTVersion != "")
		set("tls", f.TLS != (ForwardTLS{}))
		set("keepalive", f.KeepAlive != 0)
		set("persistent_session", f.PersistentSession)
		set("client_id", f.ClientID != "")
		set("local_prefix", f.LocalPrefix != "")
		if strings.ContainsAny(strings.NewReplacer("{topic}", "", "{device}", "").Replace(f.Stream), "{}") {
			v.add(key+".stream", fmt.Sprintf("may hold {topic} and {device}, nothing else in braces (got %q)", f.Stream))
		}
		return
	}
	if f.Stream != "" {
		v.add(key+".stream", fmt.Sprintf("is for a redis:// destination; to is %q", f.To))
	}
	if f.MaxLen != 0 {
		v.add(key+".max_len", fmt.Sprintf("is for a redis:// destination; to is %q", f.To))
	}
}

// topicFilter checks an MQTT topic filter: not empty, '#' only as the
// last level, '+' and '#' only as a whole level.
func topicFilter(f string) string {
	if f == "" {
		return "must not be empty"
	}
	levels := strings.Split(f, "/")
	for i, l := range levels {
		if strings.ContainsAny(l, "+#") && len(l) > 1 || l == "#" && i != len(levels)-1 {
			return fmt.Sprintf("is not a valid topic filter: '+' and '#' stand for whole levels, '#' only last (got %q)", f)
		}
	}
	return ""
}
