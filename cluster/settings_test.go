package cluster

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/cluster/redistest"
)

// Gateways sharing a real redis-server agree on cluster.decisions: the
// first one's value holds while any of them renews it; a gateway with
// the other value is refused, naming the key, and admitted once the
// settings expired after the last gateway stopped; one whose settings
// were replaced behind its back (the hash expired in an outage) logs the
// disagreement at its next renewal; with Redis down the start goes on.
func TestSettingsAgree(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	const ttl = 300 * time.Millisecond
	var logBuf syncBuffer
	log := slog.New(slog.NewTextHandler(&logBuf, nil))

	a, err := agree(rdb, "", "owner", time.Second, ttl, log)
	if err != nil {
		t.Fatalf("first gateway: %v", err)
	}
	b, err := agree(rdb, "", "owner", time.Second, ttl, log)
	if err != nil {
		t.Fatalf("second gateway, same settings: %v", err)
	}
	_, err = agree(rdb, "", "redis", time.Second, ttl, log)
	var se *SettingsError
	if !errors.As(err, &se) || se.Here != "redis" || se.There != "owner" || !strings.HasPrefix(err.Error(), `cluster.decisions: "redis" here, but the gateways sharing this redis run with "owner"`) {
		t.Fatalf("gateway deciding in redis beside owner-mode ones: %v", err)
	}
	// a and b renew it: its time to live goes up again.
	pttl := func() time.Duration {
		d, err := rdb.PTTL(t.Context(), DefaultPrefix+"settings").Result()
		if err != nil || d <= 0 {
			t.Fatalf("settings' time to live while gateways run: %v, %v", d, err)
		}
		return d
	}
	low := pttl()
	waitUntil(t, "a renewal", func() bool {
		d := pttl()
		renewed := d > low
		low = min(low, d)
		return renewed
	})
	a.Close()
	b.Close()
	waitUntil(t, "the settings expired", func() bool {
		n, err := rdb.Exists(t.Context(), DefaultPrefix+"settings").Result()
		return err == nil && n == 0
	})
	c, err := agree(rdb, "", "redis", time.Second, ttl, log)
	if err != nil {
		t.Fatalf("after every owner-mode gateway stopped and the settings expired: %v", err)
	}
	// Replaced behind c's back.
	if err := rdb.HSet(t.Context(), DefaultPrefix+"settings", "decisions", "owner").Err(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the disagreement logged", func() bool {
		return strings.Contains(logBuf.String(), "gateways sharing this redis disagree on their settings")
	})
	c.Close()

	down := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	srv.Kill()
	d, err := agree(down, "", "owner", 200*time.Millisecond, ttl, log)
	if err != nil {
		t.Fatalf("redis down at start: %v, want the start to go on", err)
	}
	d.Close()
	if !strings.Contains(logBuf.String(), "cluster settings not yet compared with the other gateways'") {
		t.Errorf("no warning with redis down at start; log:\n%s", logBuf.String())
	}
}
