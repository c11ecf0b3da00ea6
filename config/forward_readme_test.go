package config

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEForwardExamples: every yaml block of the README's Forwarding
// upstream section parses and validates (the hosts resolve nowhere: an
// address is only checked for its form): the reference example with
// every key, and the Mosquitto, EMQX and AWS IoT Core examples.
func TestREADMEForwardExamples(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Forwarding upstream\n")
	if !ok {
		t.Fatal("README has no Forwarding upstream section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var names []string
	for {
		var block string
		if _, block, ok = strings.Cut(section, "```yaml\n"); !ok {
			break
		}
		block, section, _ = strings.Cut(block, "```")
		c, err := Parse(strings.NewReader(block))
		if err == nil {
			err = c.Validate()
		}
		if err != nil || len(c.Forward) != 1 {
			t.Fatalf("README example:\n%s\n%+v, %v", block, c.Forward, err)
		}
		names = append(names, c.Forward[0].Name)
	}
	if strings.Join(names, ",") != "cloud,mosquitto,emqx,aws" {
		t.Fatalf("README forward examples %v, want cloud, mosquitto, emqx and aws", names)
	}
	_, stream, ok := strings.Cut(string(b), "\n## Forwarding to a stream\n")
	if !ok {
		t.Fatal("README has no Forwarding to a stream section")
	}
	_, block, _ := strings.Cut(stream, "```yaml\n")
	block, _, _ = strings.Cut(block, "```")
	c, err := Parse(strings.NewReader(block))
	if err == nil {
		err = c.Validate()
	}
	if err != nil || len(c.Forward) != 1 || c.Forward[0].Kind() != "redis" {
		t.Fatalf("README stream example:\n%s\n%+v, %v", block, c.Forward, err)
	}
}
