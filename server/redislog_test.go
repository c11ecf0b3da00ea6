package server

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/internal/logtest"
	"github.com/devicegate/devicegate/internal/mqtttest"
	"github.com/devicegate/devicegate/internal/poll"
)

// TestRedisClientLogsRouted: with cluster.redis, what go-redis itself
// says during an outage (its pool failing to dial) reaches the gateway's
// log as a structured warning, not stderr.
func TestRedisClientLogsRouted(t *testing.T) {
	srv := redistest.Start(t)
	cfg := testConfig(t.TempDir(), 1000, time.Hour)
	cfg.Cluster.Redis.Addrs = []string{srv.Addr}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	logs := new(logtest.Capture)
	g := mustStart(t, cfg, Deps{Logger: slog.New(logs)})
	dev := mqtttest.Dial5(t, g.Addr().String(), "dev-1")
	dev.MustPublish(t, "devices/dev-1/t", "before", mqtttest.CodeSuccess)
	srv.Kill()
	// Each publish asks Redis (failure policy local: it is still
	// admitted); the pool's dial failures are go-redis's to log.
	poll.Until(t, 10*time.Second, "go-redis's line in the gateway's log", func() bool {
		dev.MustPublish(t, "devices/dev-1/t", "during", mqtttest.CodeSuccess)
		return logs.Find("redis client") != nil
	})
	f := logs.Find("redis client")
	if f["level"] != "WARN" || f["component"] != "redis" || f["line"] == "" {
		t.Fatalf("go-redis's line logged as %v", f)
	}
	t.Logf("logged: %v", f)
}

// TestRedisLogSuppresses: at most one go-redis line a second; the next
// one logged says how many were left out.
func TestRedisLogSuppresses(t *testing.T) {
	logs := new(logtest.Capture)
	r := newRedisLog(slog.New(logs))
	now := time.Unix(1_000_000, 0)
	r.now = func() time.Time { return now }
	ctx := context.Background()
	r.Printf(ctx, "redis: dial %d", 1)
	r.Printf(ctx, "redis: dial %d", 2)
	r.Printf(ctx, "redis: dial %d", 3)
	now = now.Add(redisLogEvery)
	r.Printf(ctx, "redis: dial %d", 4)
	all := logs.All("redis client")
	if len(all) != 2 || all[0]["line"] != "dial 1" || all[1]["line"] != "dial 4" || all[1]["suppressed"] != "2" {
		t.Fatalf("logged %v; want dial 1, then dial 4 with 2 suppressed", all)
	}
}
