package config

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// The README's configuration block is the defaults, with an example rule
// and an example Redis address: it parses, validates, and apart from
// those two examples equals Default, so the README cannot drift from the
// code's defaults unnoticed.
func TestREADMEConfigurationIsTheDefaults(t *testing.T) {
	b, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(b), "```yaml\n")
	if !ok {
		t.Fatal("README's Configuration section has no yaml block")
	}
	block, _, _ = strings.Cut(block, "```")
	cfg, err := Parse(strings.NewReader(block))
	if err != nil {
		t.Fatalf("README's configuration does not parse: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("README's configuration does not validate: %v", err)
	}
	if len(cfg.Limits.Rules) != 1 || len(cfg.Cluster.Redis.Addrs) != 1 {
		t.Fatalf("README's examples changed: rules %+v, redis addrs %v", cfg.Limits.Rules, cfg.Cluster.Redis.Addrs)
	}
	cfg.Limits.Rules, cfg.Cluster.Redis.Addrs = nil, nil
	if def := Default(); !reflect.DeepEqual(cfg, def) {
		t.Fatalf("README's configuration differs from Default:\nREADME  %+v\ndefault %+v", cfg, def)
	}
}
