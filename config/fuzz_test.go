package config

import (
	"strings"
	"testing"
)

// FuzzParse checks that Parse never panics, and that whatever Parse and
// Validate accept validates again, builds a resolver, and survives a
// round trip through YAML.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"",
		"mqtt: {tcp: \":1883\"}\n",
		"data_dir: ./data\npersist: {snapshot_interval: 1s}\n",
		"data_dir: \"\"\npersist: {snapshot_interval: 2h}\n",
		"data_dir: &d \"/var/lib/x\"\npersist:\n  snapshot_interval: 100ms\nmqtt: {tcp: *d}\n",
		"limits:\n  default: {limit: 100, window: 10s, policy: drop}\n  buckets: 20\n  identity: client_id\n",
		"limits:\n  rules:\n    - name: s\n      match: {client_id: \"sensor-*\", username: \"u?\"}\n      quota: {limit: 10, window: 1s, policy: disconnect}\nlog: {level: debug}\n",
		"limits: {default: {window: 10}}\n",
		"limits: &a {rules: [*a]}\n",
		"a: &x [*x]\n",
		"limits:\n  <<: {buckets: 3}\n",
		"mqtt: {}\n---\nlog: {}\n",
		"limits: {default: &q {limit: 3}, rules: [{match: {username: u}, quota: *q}]}\n",
		"limits:\n  default: {policy: defer}\n  defer: {max_messages_per_device: 5, max_bytes_per_device: 64KiB, max_total_bytes: 1048576, max_age: 5m}\n",
		"limits: {defer: {max_total_bytes: 1GB, max_bytes_per_device: -3}}\n",
		"mqtt: {tcp: \"\", tls: {addr: \":8883\", cert_file: c, key_file: k, client_ca_file: ca}, max_packet_size: 1KiB}\n",
		"mqtt: {connect_rate: {limit: 5, window: 1s}, keepalive: {min: 5s, max: 1m}, websocket: {addr: \":0\", tls: false}}\n",
		"auth: {credentials_file: f, certificate_identity: uri, acl: {publish: \"a/+/{device}/#\", subscribe: \"{device}\"}}\nlimits: {max_devices: 3}\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		c, err := Parse(strings.NewReader(in))
		if err != nil {
			return
		}
		if c.Validate() != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("second Validate = %v", err)
		}
		if _, err := c.Resolver(); err != nil {
			t.Fatalf("valid config, Resolver() = %v", err)
		}
		if _, err := c.Identity(); err != nil {
			t.Fatalf("valid config, Identity() = %v", err)
		}
		if _, err := c.LogLevel(); err != nil {
			t.Fatalf("valid config, LogLevel() = %v", err)
		}
		roundTrip(t, c)
	})
}
