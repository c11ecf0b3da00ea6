package config

import (
	"strings"
	"testing"
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
`
	c, err := Parse(strings.NewReader(good))
	if err == nil {
		err = c.Validate()
	}
	if err != nil || len(c.Forward) != 1 || c.Forward[0].Addr() != "127.0.0.1:1884" || c.Forward[0].Topics[0] != "devices/#" {
		t.Fatalf("good forward: %+v, %v", c.Forward, err)
	}
	if c, err := Parse(strings.NewReader(`forward: [{name: a, to: "mqtt://x:1", topics: [t]}]`)); err != nil || c.Forward[0].MaxQoS != 1 {
		t.Fatalf("max_qos not given: %+v %v, want 1", c.Forward, err)
	}
	if c, err := Parse(strings.NewReader(`forward: [{name: a, to: "mqtt://x:1", topics: [t], max_qos: 0}]`)); err != nil || c.Forward[0].MaxQoS != 0 {
		t.Fatalf("max_qos 0: %+v %v", c.Forward, err)
	}
	for _, tc := range []struct{ yaml, want string }{
		{`forward: [{name: a, to: "http://x:1", topics: [t]}]`, `forward[0].to: must be mqtt://host:port (got "http://x:1")`},
		{`forward: [{name: a, to: "mqtt://x", topics: [t]}]`, `forward[0].to: must be mqtt://host:port, with the port (got "mqtt://x")`},
		{`forward: [{name: a, to: "mqtts://x:8883", topics: [t]}]`, `forward[0].to: mqtts:// is not supported yet`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: ["a/#/b"]}]`, `forward[0].topics[0]: is not a valid topic filter`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: []}]`, `forward[0].topics: must list at least one topic filter`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], local_prefix: "devices/"}]`, `forward[0].remote_prefix: local_prefix and remote_prefix go together`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], max_qos: 2}]`, `forward[0].max_qos: must be 0 or 1 (got 2)`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], subscribe: ["cmd/#/x"]}]`, `forward[0].subscribe[0]: is not a valid topic filter`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], overflow: block}]`, `forward[0].overflow: must be drop_oldest or refuse_new (got "block")`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], max_bytes: 1TB}]`, `forward[0].max_bytes: must be a size in bytes`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t]}, {name: a, to: "mqtt://y:1", topics: [t]}]`, `forward[1].name: "a" names two upstreams`},
		{`forward: [{name: a, to: "mqtt://x:1", topics: [t], rate: 0}]`, `forward[0].rate: unknown key`},
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
