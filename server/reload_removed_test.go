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
	data := filepath.Join(dir, "data")
	r := startReloadRig(t, filepath.Join(dir, "gateway.yaml"), removedFile(data, true))
	g, src, start, base, addr := r.g, r.src, r.start, r.base, r.addr
	publish, admitted := r.publish, r.admitted
	reload := func(full bool) {
		t.Helper()
		r.reload(removedFile(data, full))
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
	r.mu.Lock()
	for p, n := range r.got {
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
	r.mu.Unlock()
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

// releaseFile is a configuration file for TestReleaseDecidedAsPublish.
// Before (after false): a rule alarmers (6 an hour, its class alarms 2
// a second under policy defer), a rule sw, a rule joiners and a rule
// gone (each 2 a second, policy defer). After: alarmers has no class,
// joiners is 10 an hour in the group crew (4 an hour), gone is 3 an
// hour (policy defer); sw is as before.
func releaseFile(dir string, after bool) string {
	rules := []string{
		`{name: alarmers, match: {client_id: "alarm-*"}, quota: {limit: 6, window: 1h},
       classes: [{name: alarms, topics: ["devices/+/alarm/#"], quota: {limit: 2, window: 1s, policy: defer}}]}`,
		`{name: joiners, match: {client_id: "join-*"}, quota: {limit: 2, window: 1s, policy: defer}}`,
		`{name: gone, match: {client_id: "gone-*"}, quota: {limit: 2, window: 1s, policy: defer}}`,
		`{name: sw, match: {client_id: "sw-*"}, quota: {limit: 2, window: 1s, policy: defer}}`,
	}
	if after {
		rules[0] = `{name: alarmers, match: {client_id: "alarm-*"}, quota: {limit: 6, window: 1h}}`
		rules[1] = `{name: joiners, match: {client_id: "join-*"}, quota: {limit: 10, window: 1h},
       group: {name: crew, quota: {limit: 4, window: 1h}}}`
		rules[2] = `{name: gone, match: {client_id: "gone-*"}, quota: {limit: 3, window: 1h, policy: defer}}`
	}
	return gatewayFile(dir, "  default: {limit: 6, window: 1h}\n  rules:\n    - "+strings.Join(rules, "\n    - ")+"\n")
}

// TestReleaseDecidedAsPublish: a connected device's deferred messages
// are released as its publishes of them would be decided now, and a
// device not connected has its released by the quota they were queued
// under. Real MQTT 5 devices defer messages, then a reload removes a
// topic class (alarm-1's alarms), puts a rule's devices in a group
// (join-1, join-2) and changes the rule of a device that disconnected
// (gone-1); the rule sw is switched to shadow mode at runtime. On the
// injected clock, one step past the deferring windows: alarm-1's
// alarms go out in its own window, where its new alarms count now, not
// in the removed class's (so its telemetry then gets what they left);
// sw-1's all go out, those its window refuses let through as
// would-refuse; join-1's count in the group's window, which admits 2
// after join-2's 2 and then refuses join-2; gone-1's go out 2 a second,
// as queued, not 3 an hour.
func TestReleaseDecidedAsPublish(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	r := startReloadRig(t, filepath.Join(dir, "gateway.yaml"), releaseFile(data, false))
	deferred := func(device string, want int) {
		t.Helper()
		poll.Until(t, 20*time.Second, fmt.Sprintf("%s holding %d deferred", device, want), func() bool {
			return strings.Contains(httpGet(t, r.base+"/api/v1/devices/"+device, "test-token"), fmt.Sprintf(`"deferred":%d,`, want))
		})
	}
	at := r.start
	step := func() {
		t.Helper()
		at = at.Add(1200 * time.Millisecond) // past a 1 s window and its partly expired bucket
		r.src.Advance(1200 * time.Millisecond)
		waitClock(t, r.g, devicelimit.TickOf(at))
	}

	alarm := mqtttest.Dial5(t, r.addr, "alarm-1")
	sw := mqtttest.Dial5(t, r.addr, "sw-1")
	join1 := mqtttest.Dial5(t, r.addr, "join-1")
	join2 := mqtttest.Dial5(t, r.addr, "join-2")
	gone := mqtttest.Dial5(t, r.addr, "gone-1")
	for _, d := range []struct {
		dev    *mqtttest.Client5
		topic  string
		prefix string
		n      int
	}{
		{alarm, "devices/alarm-1/alarm/x", "a", 5},
		{sw, "devices/sw-1/t", "s", 6},
		{join1, "devices/join-1/t", "j", 5},
		{gone, "devices/gone-1/t", "g", 5},
	} {
		if acked := r.publish(d.dev, d.topic, d.prefix, d.n); len(acked) != d.n {
			t.Fatalf("%s: %v acked of %d", d.prefix, acked, d.n)
		}
		r.admitted([]string{d.prefix + "1", d.prefix + "2"}) // the rest deferred
	}
	if st := r.g.srv.Stats(); st.QueueMessages != 3+4+3+3 {
		t.Fatalf("%d messages deferred, want 13", st.QueueMessages)
	}
	gone.Close()
	poll.Until(t, 20*time.Second, "gone-1 disconnected", func() bool {
		return strings.Contains(httpGet(t, r.base+"/api/v1/devices/gone-1", "test-token"), `"connected":false`)
	})

	r.reload(releaseFile(data, true))
	httpDo(t, "PUT", r.base+"/api/v1/rules/sw/enforce", "test-token", `{"enforce":false}`, 200)
	if n := len(r.publish(join2, "devices/join-2/t", "k", 2)); n != 2 {
		t.Fatalf("join-2: %d of 2 admitted by the empty group", n)
	}

	step()
	r.admitted([]string{"a3", "a4", "a5"})       // in alarm-1's own window (6 an hour)
	r.admitted([]string{"s3", "s4", "s5", "s6"}) // 2 by the window, 2 let through
	r.admitted([]string{"j3", "j4"})             // the group's 3rd and 4th
	r.admitted([]string{"g3", "g4"})             // 2 a second, as queued
	deferred("join-1", 1)                        // the group refused j5
	if n := len(r.publish(alarm, "devices/alarm-1/t", "m", 5)); n != 3 {
		t.Errorf("alarm-1: %d of 5 admitted after its 3 released alarms, want 3 (its window of 6 an hour holds them)", n)
	}
	if n := len(r.publish(join2, "devices/join-2/t", "k", 1)); n != 0 {
		t.Errorf("join-2: %d admitted by a group whose window holds 4 (2 its own, 2 released of join-1's), want 0", n)
	}
	if rules := httpGet(t, r.base+"/api/v1/rules", "test-token"); !strings.Contains(rules, `{"rule":"sw","enforce":false,"would_refuse":2}`) {
		t.Errorf("GET /api/v1/rules: %s, want sw's 2 releases counted as would-refuse", rules)
	}

	step()
	r.admitted([]string{"g5"})
	deferred("gone-1", 0)
	deferred("join-1", 1) // still refused by the group, for the hour
	r.mu.Lock()
	defer r.mu.Unlock()
	for p, n := range r.got {
		if n != 1 {
			t.Errorf("%s received %d times", p, n)
		}
	}
	if r.got["j5"] != 0 {
		t.Errorf("j5 released beyond the group's 4 an hour")
	}
}

// reloadRig is a gateway started from the configuration file at path,
// which a test rewrites and reloads, on an injected clock, with a
// backend subscriber to devices/# counting how often each payload
// reaches it.
type reloadRig struct {
	t          *testing.T
	path       string
	g          *Gateway
	src        *devicelimit.ManualTime
	start      time.Time
	base, addr string
	seq        map[string]int // the last payload number of each prefix

	mu  sync.Mutex
	got map[string]int // payload -> times the subscriber received it
}

// startReloadRig writes file to path and starts a gateway from it.
func startReloadRig(t *testing.T, path, file string) *reloadRig {
	t.Helper()
	writeWhole(t, path, file)
	cfg, err := loadFile(path)()
	if err != nil {
		t.Fatal(err)
	}
	r := &reloadRig{t: t, path: path, start: time.Now(), seq: map[string]int{}, got: map[string]int{}}
	r.src = devicelimit.NewManualTime(r.start)
	r.g = mustStart(t, cfg, Deps{Time: r.src, Load: loadFile(path)})
	r.base = "http://" + r.g.AdminAddr().String()
	r.addr = r.g.Addr().String()
	mqtttest.Subscribe5(t, r.addr, "backend", paho.SubscribeOptions{Topic: "devices/#", QoS: 1}, func(p *paho.Publish) {
		r.mu.Lock()
		r.got[string(p.Payload)]++
		r.mu.Unlock()
	})
	return r
}

// received returns how often payload reached the subscriber.
func (r *reloadRig) received(payload string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[payload]
}

// publish publishes n messages of dev on topic (QoS 1), their payloads
// prefix and a number counting on from the prefix's last, and returns
// those acked 0x00: admitted, or deferred (acked too, not received yet).
func (r *reloadRig) publish(dev *mqtttest.Client5, topic, prefix string, n int) (acked []string) {
	r.t.Helper()
	for range n {
		r.seq[prefix]++
		p := fmt.Sprintf("%s%d", prefix, r.seq[prefix])
		code, err := dev.Publish(topic, p)
		if err != nil {
			r.t.Fatalf("publish %s: %v", p, err)
		}
		switch code {
		case mqtttest.CodeSuccess:
			acked = append(acked, p)
		case mqtttest.CodeQuotaExceeded:
		default:
			r.t.Fatalf("publish %s: PUBACK 0x%02x", p, code)
		}
	}
	return acked
}

// admitted waits until each of acked reached the subscriber and returns
// how many did.
func (r *reloadRig) admitted(acked []string) int {
	r.t.Helper()
	poll.Until(r.t, 20*time.Second, fmt.Sprintf("%v received", acked), func() bool {
		for _, p := range acked {
			if r.received(p) == 0 {
				return false
			}
		}
		return true
	})
	return len(acked)
}

// reload writes file to the rig's path and reloads it through the admin
// API.
func (r *reloadRig) reload(file string) {
	r.t.Helper()
	writeWhole(r.t, r.path, file)
	a, err := postReload(r.base)
	if err != nil || !a.ok {
		r.t.Fatalf("reload: %v %s", err, a.text)
	}
}
