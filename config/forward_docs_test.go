package config

import (
	"os"
	"strings"
	"testing"
)

// docsForwards returns the forward entry of each yaml block of the
// section heading (level 2) of docs/forwarding.md, each parsed and
// validated.
func docsForwards(t *testing.T, heading string) []Forward {
	t.Helper()
	b, err := os.ReadFile("../docs/forwarding.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("docs/forwarding.md has no %s section", heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var out []Forward
	for {
		var block string
		if _, block, ok = strings.Cut(section, "```yaml\n"); !ok {
			return out
		}
		block, section, _ = strings.Cut(block, "```")
		c, err := Parse(strings.NewReader(block))
		if err == nil {
			err = c.Validate()
		}
		if err != nil || len(c.Forward) != 1 {
			t.Fatalf("docs/forwarding.md example in %s:\n%s\n%+v, %v", heading, block, c.Forward, err)
		}
		out = append(out, c.Forward[0])
	}
}

// TestDocsForwardExamples: every yaml block of docs/forwarding.md's MQTT
// upstream and Streams sections parses and validates (the hosts resolve
// nowhere: an address is only checked for its form): the reference
// example with every key, the Mosquitto, EMQX and AWS IoT Core examples,
// and one per stream.
func TestDocsForwardExamples(t *testing.T) {
	var names, kinds []string
	for _, f := range docsForwards(t, "MQTT upstream") {
		names = append(names, f.Name)
	}
	if strings.Join(names, ",") != "cloud,mosquitto,emqx,aws" {
		t.Fatalf("docs/forwarding.md forward examples %v, want cloud, mosquitto, emqx and aws", names)
	}
	for _, f := range docsForwards(t, "Streams") {
		kinds = append(kinds, f.Kind())
	}
	if strings.Join(kinds, ",") != "redis,nats,kafka" {
		t.Fatalf("docs/forwarding.md stream examples %v, want redis, nats and kafka", kinds)
	}
}
