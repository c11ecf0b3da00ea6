package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/internal/poll"
)

// TestForwardDeadLettersProcess: a real gateway forwards 20 devices to
// a real redis-server where one device's stream key holds a string
// (SET devices/dev-00/t x): Redis refuses that device's XADDs with
// WRONGTYPE. Every other acknowledged message arrives once, in order;
// dev-00's are dead letters, shown by forward status, the API and the
// metrics, listed by `gateway forward dead list`; with the key deleted,
// `gateway forward dead replay` delivers them, in order.
func TestForwardDeadLettersProcess(t *testing.T) {
	const devices = 20
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	if err := c.Set(ctx, "devices/dev-00/t", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	d := redisDest(t, devices)
	d.to = "redis://" + srv.Addr
	d.refresh = func() { // redisDest's, skipping the key that is no stream
		got := map[string][]int{}
		for i := range devices {
			topic := fmt.Sprintf("devices/dev-%02d/t", i)
			if typ, _ := c.Type(ctx, topic).Result(); typ != "stream" {
				continue
			}
			msgs, err := c.XRange(ctx, topic, "-", "+").Result()
			if err != nil {
				t.Fatalf("XRANGE %s: %v", topic, err)
			}
			for _, m := range msgs {
				var n int
				fmt.Sscan(m.Values["payload"].(string), &n)
				got[topic] = append(got[topic], n)
			}
		}
		d.log.mu.Lock()
		d.log.got = got
		d.log.mu.Unlock()
	}
	conf := writeConfig(t, fmt.Sprintf("forward: [{name: cloud, to: %q, topics: [\"devices/#\"], stream: \"{topic}\"}]\n", d.to))
	g := startGW(t, t.TempDir(), "--config", conf, "--limit", "100000", "--window", "1s")
	f := startFleet(g.mqtt, devices, 20*time.Millisecond)
	poll.Until(t, 30*time.Second, "40 messages a device", func() bool { return f.sent.Load() >= devices*40 })
	acked := f.halt()
	bad := acked["devices/dev-00/t"]
	delete(acked, "devices/dev-00/t")
	poll.Until(t, 30*time.Second, "the backlog gone through", func() bool {
		_, v := g.call(t, "GET", "/api/v1/forward", "")
		return v["upstreams"].([]any)[0].(map[string]any)["backlog_messages"].(float64) == 0
	})
	d.refresh()
	if missing, order, dups := d.log.check(acked); missing > 0 || order != "" || dups > 0 {
		t.Fatalf("the other devices: %d missing, %d duplicates, order %q", missing, dups, order)
	}
	_, v := g.call(t, "GET", "/api/v1/forward", "")
	up := v["upstreams"].([]any)[0].(map[string]any)
	if up["dead_letters"].(float64) != float64(bad) || up["connected"].(float64) != 1 {
		t.Fatalf("GET /api/v1/forward: %v; want %d dead letters, connected", up, bad)
	}
	samples, _ := g.scrape(t)
	if n := samples[`devicegate_forward_dead_letters_total{reason="wrong_type",upstream="cloud"}`]; n != float64(bad) {
		t.Fatalf("devicegate_forward_dead_letters_total = %v, want %d", n, bad)
	}
	admin := []string{"--admin-addr", g.admin, "--token", g.token}
	code, out, errOut := runBinary(t, append([]string{"forward", "status"}, admin...)...)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("wrong_type %d", bad)) {
		t.Fatalf("forward status: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runBinary(t, append([]string{"forward", "dead", "list", "cloud", "--limit", "3"}, admin...)...)
	if code != 0 || !strings.Contains(out, "WRONGTYPE") || !strings.Contains(out, "dev-00") || !strings.Contains(out, fmt.Sprintf("3 of %d shown", bad)) {
		t.Fatalf("forward dead list: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("gateway forward dead list cloud --limit 3:\n%s", out)
	c.Del(ctx, "devices/dev-00/t")
	code, out, errOut = runBinary(t, append([]string{"forward", "dead", "replay", "cloud"}, admin...)...)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("%d dead letters sent again", bad)) {
		t.Fatalf("forward dead replay: exit %d\n%s%s", code, out, errOut)
	}
	acked["devices/dev-00/t"] = bad
	poll.Until(t, 30*time.Second, "the replay delivered", func() bool {
		d.refresh()
		missing, _, _ := d.log.check(acked)
		return missing == 0
	})
	if _, order, dups := d.log.check(acked); order != "" || dups > 0 {
		t.Fatalf("after the replay: %d duplicates, order %q", dups, order)
	}
	g.stop()
	t.Logf("%d devices: dev-00's %d messages refused (WRONGTYPE), dead-lettered and replayed; every other message once, in order", devices, bad)
}
