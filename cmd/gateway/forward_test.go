package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/internal/gatewaytest"
	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/poll"
)

// TestForwardStatus: gateway forward status shows the upstream, its
// connection and its log, in a table and as the API's JSON; with the
// upstream gone, why and when the next attempt comes.
func TestForwardStatus(t *testing.T) {
	up := mosquittotest.Start(t)
	cfg := config.Default()
	cfg.MQTT.TCP, cfg.Admin.Addr, cfg.DataDir, cfg.Admin.Token = "127.0.0.1:0", "127.0.0.1:0", t.TempDir(), "forward-test-token"
	cfg.Forward = []config.Forward{{Name: "cloud", To: "mqtt://" + up.Addr, Topics: []string{"devices/#"}, MaxQoS: 1}}
	g := gatewaytest.Start(t, cfg)
	status := func(args ...string) string {
		var out strings.Builder
		all := append([]string{"forward", "status", "--admin-addr", g.AdminAddr().String(), "--token", cfg.Admin.Token}, args...)
		if err := run(context.Background(), all, &out, &out); err != nil {
			t.Fatalf("forward status: %v\n%s", err, out.String())
		}
		return out.String()
	}
	poll.Until(t, 20*time.Second, "the upstream connected", func() bool {
		out := status()
		return strings.Contains(out, "cloud ") && strings.Contains(out, " 1/1 ")
	})
	// Dead letters: errors name the forward subcommand (before, "quota
	// forward dead list: ..."); none to replay or drop is a count of 0.
	dead := func(args ...string) (string, error) {
		var out strings.Builder
		err := run(context.Background(), append(append([]string{"forward", "dead"}, args...), "--admin-addr", g.AdminAddr().String(), "--token", cfg.Admin.Token), &out, &out)
		return out.String(), err
	}
	if _, err := dead("list", "nope"); err == nil || !strings.HasPrefix(err.Error(), "forward dead list: ") || !strings.Contains(err.Error(), `no upstream named "nope"`) {
		t.Fatalf("forward dead list nope: %v", err)
	}
	if out, err := dead("replay", "cloud"); err != nil || out != "cloud: 0 dead letters sent again\n" {
		t.Fatalf("forward dead replay: %q, %v", out, err)
	}
	if out, err := dead("drop", "cloud", "--json"); err != nil || !strings.Contains(out, `"dropped": 0`) {
		t.Fatalf("forward dead drop --json: %q, %v", out, err)
	}
	if _, err := dead("drop", "cloud", "--id", "nope"); err == nil || !strings.HasPrefix(err.Error(), "forward dead drop: ") || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("forward dead drop --id nope: %v", err)
	}
	if out := status("--json"); !strings.Contains(out, `"name": "cloud"`) || !strings.Contains(out, `"connected": 1`) || !strings.Contains(out, `"connections": 1`) {
		t.Fatalf("--json:\n%s", out)
	}
	// The upstream gone: the table says why, and when the next attempt
	// comes.
	up.Stop()
	poll.Until(t, 20*time.Second, "the reason and the next attempt", func() bool {
		out := status()
		return strings.Contains(out, "cloud: ") && strings.Contains(out, "(next attempt in ")
	})
	if err := run(context.Background(), []string{"forward", "list"}, new(strings.Builder), new(strings.Builder)); err == nil {
		t.Fatal("forward list: want a usage error")
	}
}
