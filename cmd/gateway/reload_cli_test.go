package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/internal/freeport"
	"github.com/devicegate/devicegate/server"
)

// TestReloadCommandErrors: a refused reload and an unreachable gateway
// fail with "reload refused: ..." or "reload: ..." (exit 1), never
// "quota reload" as before; with --json
// the refusal is also JSON on stdout; a reload that works prints the
// changes, as JSON with --json.
func TestReloadCommandErrors(t *testing.T) {
	cfg := config.Default()
	cfg.MQTT.TCP, cfg.Admin.Addr, cfg.DataDir, cfg.Admin.Token = "127.0.0.1:0", "127.0.0.1:0", t.TempDir(), "reload-test-token"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	next := cfg
	g, err := server.Start(cfg, server.Deps{Load: func() (config.Config, error) { return next, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), server.ShutdownTimeout)
		defer cancel()
		if err := g.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	reload := func(addr string, extra ...string) (stdout, stderr string, code int) {
		var out, errOut strings.Builder
		err := run(context.Background(), append([]string{"reload", "--admin-addr", addr, "--token", cfg.Admin.Token}, extra...), &out, &errOut)
		code = exitCode(err, &errOut)
		return out.String(), errOut.String(), code
	}
	addr := g.AdminAddr().String()

	next.MQTT.MaxConnections = 9 // needs a restart
	for _, extra := range [][]string{nil, {"--json"}} {
		stdout, stderr, code := reload(addr, extra...)
		if code != 1 || !strings.HasPrefix(stderr, "gateway: reload refused: mqtt.max_connections: cannot change without a restart") || strings.Contains(stderr, "quota") {
			t.Errorf("refused reload %v: exit %d, stderr %q", extra, code, stderr)
		}
		var v struct {
			Error  string
			Status int
		}
		switch {
		case extra == nil && stdout != "":
			t.Errorf("refused reload: stdout %q, want nothing", stdout)
		case extra != nil && (json.Unmarshal([]byte(stdout), &v) != nil || v.Status != 409 || !strings.HasPrefix(v.Error, "reload refused: mqtt.max_connections: ")):
			t.Errorf("refused reload --json: stdout %q, want the refusal as JSON with status 409", stdout)
		}
	}

	dead, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := reload(dead, "--json")
	if code != 1 || !strings.HasPrefix(stderr, "gateway: reload: cannot reach the admin API at "+dead) || !strings.Contains(stdout, `"status": 0`) {
		t.Errorf("unreachable gateway --json: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	next = cfg
	next.Limits.Default.Limit = 7
	if stdout, stderr, code := reload(addr); code != 0 || stdout != "reloaded: 1 changes\n  limits.default.limit: \"100\" -> \"7\"\n" {
		t.Errorf("reload: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	next.Limits.Default.Limit = 8
	if stdout, _, code := reload(addr, "--json"); code != 0 || !strings.Contains(stdout, `"key": "limits.default.limit"`) {
		t.Errorf("reload --json: exit %d, stdout %q", code, stdout)
	}
}
