package config

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEForwardExample: the README's forward: example parses and
// validates (with a host that resolves nowhere: the address is only
// checked for its form).
func TestREADMEForwardExample(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Forwarding upstream\n")
	if !ok {
		t.Fatal("README has no Forwarding upstream section")
	}
	_, block, ok := strings.Cut(section, "```yaml\n")
	if !ok {
		t.Fatal("the section has no yaml block")
	}
	block, _, _ = strings.Cut(block, "```")
	c, err := Parse(strings.NewReader(block))
	if err == nil {
		err = c.Validate()
	}
	if err != nil || len(c.Forward) != 1 || c.Forward[0].Name != "cloud" || c.Forward[0].MaxQoS != 1 {
		t.Fatalf("README example: %+v, %v", c.Forward, err)
	}
}
