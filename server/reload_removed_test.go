package server

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/mqtttest"
	"github.com/devicegate/devicegate/internal/poll"
)

// removedFile is a configuration file with, when full, a rule meters
// (4 an hour, a class alarms of 3 an hour), a rule tenants in the group
// acme (each device 5 an hour, the group 6), a rule slow (2 a second,
// policy defer) and a rule wide that meters hides (5 an hour); without
// full, only wide. Both have a rule bulk whose class bulk is 2 a second
// under policy defer when full, else 6 an hour (drop). The default is 6
// an hour, policy drop.
func removedFile(dir string, full bool) string {
	bulk := "{limit: 6, window: 1h}"
	if full {
		bulk = "{limit: 2, window: 1s, policy: defer}"
	}
	rules := `
    - name: wide
      match: {client_id: "meter-*"}
      quota: {limit: 5, window: 1h}
    - name: bulk
      match: {client_id: "bulk-*"}
      quota: {limit: 100, window: 1h}
      classes:
        - {name: bulk, topics: ["devices/+/bulk/#"], quota: ` + bulk + `}`
	if full {
		rules = `
    - name: meters
      match: {client_id: "meter-*"}
      quota: {limit: 4, window: 1h}
      classes:
        - {name: alarms, topics: ["devices/+/alarm/#"], quota: {limit: 3, window: 1h}}
    - name: tenants
      match: {client_id: "tenant-*"}
      quota: {limit: 5, window: 1h}
      group: {name: acme, quota: {limit: 6, window: 1h}}
    - name: slow
      match: {client_id: "slow-*"}
      quota: {limit: 2, window: 1s, policy: defer}` + rules
	}
	return gatewayFile(dir, "  default: {limit: 6, window: 1h}\n  rules:"+rules+"\n")
}

// TestReloadRemovesRuleClassGroup: a reload removes a rule that a
// connected device matches (it falls to the next rule), a topic class
// in use, a group whose devices hold counts in its window, and a rule
// of policy defer with messages deferred under it; then a reload adds
// them again. Real MQTT 5 devices publish through both reloads on the
// injected clock. No device is admitted beyond the quota it is under:
// its own window keeps its counts across the removal (a device that
// falls to another quota gets only what that quota leaves); a message of
// the removed class counts in the device's window; the removed group
// caps nothing more; the deferred messages are each released once, by
// a window that also counts what the device published meanwhile. The
// admin API stops showing what was removed. Added again, the rule, class
// and group find their windows' counts: no fresh quota.
func TestReloadRemovesRuleClassGroup(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.yaml")
	data := filepath.Join(dir, "data")
	writeWhole(t, path, removedFile(data, true))
	cfg, err := loadFile(path)()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	src := devicelimit.NewManualTime(start)
	g := mustStart(t, cfg, Deps{Time: src, Load: loadFile(path)})
	base := "http://" + g.AdminAddr().String()
	addr := g.Addr().String()

	var mu sync.Mutex
	got := map[string]int{} // payload -> times a subscriber received it
	mqtttest.Subscribe5(t, addr, "backend", paho.SubscribeOptions{Topic: "devices/#", QoS: 1}, func(p *paho.Publish) {
		mu.Lock()
		got[string(p.Payload)]++
		mu.Unlock()
	})
	received := func(payload string) int {
		mu.Lock()
		defer mu.Unlock()
		return got[payload]
	}
	// admitted publishes n messages (payloads prefix1..prefixN, QoS 1)
	// and returns how many were admitted (PUBACK 0x00 and received: a
	// deferred one is acked 0x00 too, but not received yet).
	seq := map[string]int{}
	publish := func(dev *mqtttest.Client5, topic, prefix string, n int) (acked []string) {
		t.Helper()
		for range n {
			seq[prefix]++
			p := fmt.Sprintf("%s%d", prefix, seq[prefix])
			code, err := dev.Publish(topic, p)
			if err != nil {
				t.Fatalf("publish %s: %v", p, err)
			}
			switch code {
			case mqtttest.CodeSuccess:
				acked = append(acked, p)
			case mqtttest.CodeQuotaExceeded:
			default:
				t.Fatalf("publish %s: PUBACK 0x%02x", p, code)
			}
		}
		return acked
	}
	// admitted waits until each of acked reached the subscriber and
	// returns how many did.
	admitted := func(acked []string) int {
		t.Helper()
		poll.Until(t, 20*time.Second, fmt.Sprintf("%v received", acked), func() bool {
			for _, p := range acked {
				if received(p) == 0 {
					return false
				}
			}
			return true
		})
		return len(acked)
	}
	reload := func(full bool) {
		t.Helper()
		writeWhole(t, path, removedFile(data, full))
		a, err := postReload(base)
		if err != nil || !a.ok {
			t.Fatalf("reload: %v %s", err, a.text)
		}
	}

	meter := mqtttest.Dial5(t, addr, "meter-1")
	tenant1 := mqtttest.Dial5(t, addr, "tenant-1")
	tenant2 := mqtttest.Dial5(t, addr, "tenant-2")
	slow := mqtttest.Dial5(t, addr, "slow-1")
	bulk := mqtttest.Dial5(t, addr, "bulk-1")

	// Before: each quota takes what it allows.
	check := func(what string, n, want int) {
		t.Helper()
		if n != want {
			t.Fatalf("%s: %d admitted, want %d", what, n, want)
		}
	}
	check("meter-1 telemetry under meters", admitted(publish(meter, "devices/meter-1/t", "m", 5)), 4)
	check("meter-1 alarms under the class", admitted(publish(meter, "devices/meter-1/alarm/x", "a", 4)), 3)
	check("tenant-1 under the group", admitted(publish(tenant1, "devices/tenant-1/t", "t1-", 4)), 4)
	check("tenant-2 under the group's 6", admitted(publish(tenant2, "devices/tenant-2/t", "t2-", 4)), 2)
	sent := publish(slow, "devices/slow-1/t", "s", 5) // 2 admitted, 3 deferred: all acked
	if len(sent) != 5 {
		t.Fatalf("slow-1: %v acked of 5", sent)
	}
	admitted(sent[:2])
	if sent = publish(bulk, "devices/bulk-1/bulk/x", "b", 5); len(sent) != 5 { // the same in class bulk
		t.Fatalf("bulk-1: %v acked of 5", sent)
	}
	admitted(sent[:2])
	if st := g.srv.Stats(); st.QueueMessages != 6 {
		t.Fatalf("%d messages deferred, want 6", st.QueueMessages)
	}

	reload(false)
	// The admin API shows the rule in force, no class, no group.
	if dv := httpGet(t, base+"/api/v1/devices/meter-1", "test-token"); !strings.Contains(dv, `"source":"rule:wide"`) || strings.Contains(dv, `"classes"`) {
		t.Fatalf("meter-1 after the removal: %s", dv)
	}
	if rules := httpGet(t, base+"/api/v1/rules", "test-token"); strings.Contains(rules, "meters") || strings.Contains(rules, "tenants") || strings.Contains(rules, `"slow"`) {
		t.Fatalf("GET /api/v1/rules after the removal: %s", rules)
	}
	if groups := httpGet(t, base+"/api/v1/groups", "test-token"); strings.Contains(groups, "acme") {
		t.Fatalf("GET /api/v1/groups after the removal: %s", groups)
	}
	// meter-1 falls to wide (5): its window holds the 4 of meters, so
	// one more, alarm or telemetry (alarms count there now).
	check("meter-1 under wide", admitted(publish(meter, "devices/meter-1/alarm/x", "a", 2))+admitted(publish(meter, "devices/meter-1/t", "m", 2)), 1)
	// The tenants fall to the default (6) with their counts; no group.
	check("tenant-1 under the default", admitted(publish(tenant1, "devices/tenant-1/t", "t1-", 4)), 2)
	check("tenant-2 under the default", admitted(publish(tenant2, "devices/tenant-2/t", "t2-", 5)), 4)
	// slow-1 falls to the default (6 an hour) with its 2 counted: it
	// publishes 1 more. Its 3 deferred go out as the window admits them,
	// counted in the window its publishes count in: in the hour, 6 in
	// all, released ones included. (The rule's 1 s window, re-cut from
	// the default's hour, counts what the hour's newest bucket, 3 min
	// long, holds until that bucket ends: the first step passes it.)
	// So does bulk-1 in its class bulk, whose quota the reload changed
	// to 6 an hour.
	check("slow-1 under the default", admitted(publish(slow, "devices/slow-1/t", "d", 1)), 1)
	check("bulk-1 under the class's new quota", admitted(publish(bulk, "devices/bulk-1/bulk/x", "c", 1)), 1)
	at := start
	for step, d := range []time.Duration{200 * time.Second, 1100 * time.Millisecond, 1100 * time.Millisecond, 200 * time.Second} {
		at = at.Add(d)
		src.Advance(d)
		waitClock(t, g, devicelimit.TickOf(at))
		if step == 0 {
			admitted([]string{"s3", "s4", "b3", "b4"})
		}
		admitted(publish(slow, "devices/slow-1/t", "d", 4))
		admitted(publish(bulk, "devices/bulk-1/bulk/x", "c", 4))
	}
	poll.Until(t, 20*time.Second, "the deferred gone", func() bool { return g.srv.Stats().QueueMessages == 0 })
	st := g.srv.Stats()
	total := map[string]int{}
	mu.Lock()
	for p, n := range got {
		if strings.ContainsAny(p[:1], "sb") && n != 1 || strings.ContainsAny(p[:1], "dc") && n > 1 {
			t.Errorf("%s received %d times", p, n)
		}
		switch p[0] {
		case 's', 'd':
			total["slow-1"] += n
		case 'b', 'c':
			total["bulk-1"] += n
		}
	}
	mu.Unlock()
	if st.Released != 6 || st.Expired != 0 {
		t.Fatalf("deferred: %d released, %d expired; want 6 and 0", st.Released, st.Expired)
	}
	for dev, n := range total {
		if n != 6 {
			t.Errorf("%s: %d admitted within the hour (released included), its quota 6 across the reload", dev, n)
		}
	}
	// The metrics keep a removed group's and class's series, counted
	// before the removal and growing no more.
	for series, want := range map[string]float64{
		`devicegate_group_publishes_total{group="acme",outcome="admitted"}`:  6,
		`devicegate_group_publishes_total{group="acme",outcome="refused"}`:   2,
		`devicegate_window_refusals_total{class="alarms",window="messages"}`: 1,
	} {
		if got := metric(t, base+"/metrics", series); got != want {
			t.Errorf("%s %v, want %v", series, got, want)
		}
	}

	// Added again within the hour: the rule, the class and the group
	// find their windows as they were.
	reload(true)
	check("meter-1 under meters again (its window holds 5)", admitted(publish(meter, "devices/meter-1/t", "m", 1)), 0)
	check("meter-1's alarms under the class again (it holds 3)", admitted(publish(meter, "devices/meter-1/alarm/x", "a", 1)), 0)
	tenant3 := mqtttest.Dial5(t, addr, "tenant-3") // a window of its own empty, the group's holding 6
	code, reason, err := tenant3.PublishReason("devices/tenant-3/t", "t3-1")
	if err != nil || code != mqtttest.CodeQuotaExceeded || !strings.Contains(reason, "group acme") {
		t.Fatalf("tenant-3 in acme again: 0x%02x %q %v, want 0x97 by the group", code, reason, err)
	}
	if rules := httpGet(t, base+"/api/v1/rules", "test-token"); !strings.Contains(rules, `"rule":"meters"`) || !strings.Contains(rules, `"name":"alarms"`) {
		t.Fatalf("GET /api/v1/rules after adding them again: %s", rules)
	}
	if groups := httpGet(t, base+"/api/v1/groups", "test-token"); !strings.Contains(groups, "acme") {
		t.Fatalf("GET /api/v1/groups after adding it again: %s", groups)
	}
}
