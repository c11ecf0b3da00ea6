package config

import (
	"os"
	"strings"
	"testing"
)

// readmeForwards returns the forward entry of each yaml block of the
// README's section heading, each parsed and validated.
func readmeForwards(t *testing.T, heading string) []Forward {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("README has no %s section", heading)
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
			t.Fatalf("README example in %s:\n%s\n%+v, %v", heading, block, c.Forward, err)
		}
		out = append(out, c.Forward[0])
	}
}

// TestREADMEForwardExamples: every yaml block of the README's Forwarding
// upstream and Forwarding to a stream sections parses and validates (the
// hosts resolve nowhere: an address is only checked for its form): the
// reference example with every key, the Mosquitto, EMQX and AWS IoT
// Core examples, and one per stream.
func TestREADMEForwardExamples(t *testing.T) {
	var names, kinds []string
	for _, f := range readmeForwards(t, "Forwarding upstream") {
		names = append(names, f.Name)
	}
	if strings.Join(names, ",") != "cloud,mosquitto,emqx,aws" {
		t.Fatalf("README forward examples %v, want cloud, mosquitto, emqx and aws", names)
	}
	for _, f := range readmeForwards(t, "Forwarding to a stream") {
		kinds = append(kinds, f.Kind())
	}
	if strings.Join(kinds, ",") != "redis,nats,kafka" {
		t.Fatalf("README stream examples %v, want redis, nats and kafka", kinds)
	}
}
