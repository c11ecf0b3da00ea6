package config

import (
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// examplePath is the annotated example configuration.
const examplePath = "../deploy/gateway.example.yaml"

// commentedKeyRE matches the first line of a commented-out section.
var commentedKeyRE = regexp.MustCompile(`^# [a-z_]+:$`)

// TestExampleConfigValidates: deploy/gateway.example.yaml parses and
// validates as it is, listens on loopback only, keeps its data in a
// relative directory, and the sections it leaves commented out (cluster,
// forward) parse and validate once uncommented.
func TestExampleConfigValidates(t *testing.T) {
	b, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(strings.NewReader(string(b)))
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		t.Fatalf("%s: %v", examplePath, err)
	}
	for key, addr := range map[string]string{"mqtt.tcp": cfg.MQTT.TCP, "admin.addr": cfg.Admin.Addr} {
		host, _, err := net.SplitHostPort(addr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			t.Errorf("%s: %s is %q, want a loopback address", examplePath, key, addr)
		}
	}
	if filepath.IsAbs(cfg.DataDir) {
		t.Errorf("%s: data_dir is %q, want a relative directory", examplePath, cfg.DataDir)
	}
	if len(cfg.Limits.Rules) == 0 {
		t.Errorf("%s: no example rules", examplePath)
	}

	// The commented sections: a line "# key:" starts one, and the lines
	// indented under it ("#   ...") are its body.
	var sections []string
	for line := range strings.SplitSeq(string(b), "\n") {
		switch {
		case commentedKeyRE.MatchString(line):
			sections = append(sections, strings.TrimPrefix(line, "# ")+"\n")
		case len(sections) > 0 && strings.HasPrefix(line, "#   "):
			sections[len(sections)-1] += strings.TrimPrefix(line, "# ") + "\n"
		}
	}
	if len(sections) != 2 {
		t.Fatalf("%s: %d commented sections, want 2 (cluster, forward): %q", examplePath, len(sections), sections)
	}
	for _, s := range sections {
		c, err := Parse(strings.NewReader(s))
		if err == nil {
			err = c.Validate()
		}
		if err != nil {
			t.Errorf("%s: the commented section\n%s\ndoes not validate once uncommented: %v", examplePath, s, err)
		}
	}
}
