package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/poll"
	"github.com/devicegate/devicegate/server"
)

// TestForwardShutdownBoundedProcess: SIGTERM finishes within
// server.ShutdownTimeout with a clean final snapshot whatever the
// upstream does, and the next start is clean. A real gateway forwards
// the publishes of 20 devices to a real Mosquitto over MQTT 3.1.1; the
// upstream is stopped gracefully (its process ended with SIGTERM: a
// closed connection, which left paho's Publish blocked 30 s without a
// write timeout), or paused (SIGSTOP: it stops answering), and the
// gateway is sent SIGTERM at once.
func TestForwardShutdownBoundedProcess(t *testing.T) {
	up := mosquittotest.Start(t)
	dir := t.TempDir()
	conf := writeConfig(t, fmt.Sprintf("forward: [{name: cloud, to: %q, topics: [\"devices/#\"]}]\n", "mqtt://"+up.Addr))
	args := []string{"--config", conf, "--limit", "100000", "--window", "1s"}
	for round, how := range []string{"stopped", "paused", "stopped", "paused"} {
		g := startGW(t, dir, args...)
		if round > 0 && strings.Contains(g.stderr(), "did not shut down cleanly") {
			t.Fatalf("round %d: the start after a SIGTERM is taken for a crash; stderr:\n%s", round, g.stderr())
		}
		poll.Until(t, 10*time.Second, "the upstream connection", func() bool {
			_, v := g.call(t, "GET", "/api/v1/forward", "")
			return strings.Contains(fmt.Sprint(v), "connected:1")
		})
		f := startFleet(g.mqtt, 20, 5*time.Millisecond)
		poll.Until(t, 20*time.Second, "traffic upstream", func() bool {
			_, v := g.call(t, "GET", "/api/v1/forward", "")
			return v["upstreams"].([]any)[0].(map[string]any)["forwarded"].(float64) > 200
		})
		if how == "stopped" {
			up.Stop()
		} else {
			up.Pause()
		}
		took := g.stop() // fails beyond server.ShutdownTimeout
		for _, bad := range []string{"not done in time", "not stopped in time", "level=ERROR"} {
			if strings.Contains(g.stderr(), bad) {
				t.Fatalf("round %d (upstream %s): %q in the log of the shutdown; stderr:\n%s", round, how, bad, g.stderr())
			}
		}
		f.halt()
		t.Logf("round %d: upstream %s, SIGTERM: exit in %s (bound %s)", round, how, took.Round(time.Millisecond), server.ShutdownTimeout)
		if how == "stopped" {
			up.Restart()
		} else {
			up.Resume()
		}
	}
	g := startGW(t, dir, args...)
	if strings.Contains(g.stderr(), "did not shut down cleanly") {
		t.Fatalf("the start after the last SIGTERM is taken for a crash; stderr:\n%s", g.stderr())
	}
	g.stop()
}
