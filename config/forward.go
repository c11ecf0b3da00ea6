package config

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Forward is one upstream the gateway hands admitted messages on to
// (README, "Forwarding upstream").
type Forward struct {
	// Name names the upstream in logs and its forward log; unique.
	Name string `yaml:"name"`
	// To is the upstream broker: mqtt://host:port (MQTT 3.1.1 over TCP).
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
	// Username and Password log in upstream.
	Username string `yaml:"username,omitempty"`
	Password string `yaml:"password,omitempty"`
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
		if (f.LocalPrefix == "") != (f.RemotePrefix == "") || strings.ContainsAny(f.LocalPrefix+f.RemotePrefix, "+#") {
			v.add(key+".remote_prefix", fmt.Sprintf("local_prefix and remote_prefix go together, without wildcards (got %q and %q)", f.LocalPrefix, f.RemotePrefix))
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

// upstreamURL checks an upstream address: mqtt://host:port.
func upstreamURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "mqtt" || u.Host == "" || u.Path != "" && u.Path != "/" {
		if err == nil && u.Scheme == "mqtts" {
			return fmt.Sprintf("mqtts:// is not supported yet; use mqtt://host:port (got %q)", s)
		}
		return fmt.Sprintf("must be mqtt://host:port (got %q)", s)
	}
	if _, port, err := net.SplitHostPort(u.Host); err != nil || port == "" {
		return fmt.Sprintf("must be mqtt://host:port, with the port (got %q)", s)
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Sprintf("port must be 1 to 65535 (got %q)", s)
	}
	return ""
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
