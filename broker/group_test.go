package broker

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/logtest"
)

// tenantRule puts devices "t-NAME-*" in group NAME: each device 10 per
// second, the group 3 per second, and a topic class "alarms" of its own
// 5 per second per device; policy p.
func tenantRule(p devicelimit.Policy) devicelimit.Rule {
	return devicelimit.Rule{
		Name: "tenants", ClientID: "t-{tenant}-*",
		Quota:   devicelimit.Quota{Limit: 10, Window: time.Second, Policy: p},
		Classes: []devicelimit.Class{{Name: "alarms", Topics: []string{"a/#"}, Quota: devicelimit.Quota{Limit: 5, Window: time.Second, Policy: p}}},
		Group:   &devicelimit.Group{Name: "{tenant}", Quota: devicelimit.Quota{Limit: 3, Window: time.Second}},
	}
}

// TestGroupAcrossClassesAndProtocols: a tenant's 3 messages a second are
// shared by its devices over MQTT 5 and 3.1.1 and count a topic class's
// messages too; MQTT 5 learns that the group refused (0x97, the reason
// names it); another tenant is served; the window frees on the clock.
func TestGroupAcrossClassesAndProtocols(t *testing.T) {
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{tenantRule(devicelimit.PolicyDrop)}})
	a5 := f.connect(t, 5, "t-acme-1", "")
	a3 := f.connect(t, 3, "t-acme-2", "")
	if a, err := a5.publish(t, "x/1", "1", 1); err != nil || a.code != 0 {
		t.Fatalf("first: 0x%02x %v", a.code, err)
	}
	if a, err := a3.publish(t, "x/2", "2", 1); err != nil || a.code != 0 {
		t.Fatalf("3.1.1: 0x%02x %v", a.code, err)
	}
	if a, err := a5.publish(t, "a/fire", "3", 1); err != nil || a.code != 0 {
		t.Fatalf("alarm class: 0x%02x %v", a.code, err)
	}
	a, err := a5.publish(t, "a/fire", "4", 1)
	if err != nil || a.code != 0x97 || !strings.HasPrefix(a.reason, "quota of group acme exceeded: 3 messages per 1s, retry after ") {
		t.Fatalf("fourth of the tenant: 0x%02x %q %v", a.code, a.reason, err)
	}
	b := f.connect(t, 5, "t-beta-1", "")
	if a, err := b.publish(t, "x/b", "b", 1); err != nil || a.code != 0 {
		t.Fatalf("another tenant: 0x%02x %v", a.code, err)
	}
	st := f.srv.Stats().Groups["{tenant}"]
	if st[GroupAdmitted] != 4 || st[GroupRefused] != 1 {
		t.Fatalf("group stats %v, want 4 admitted, 1 refused", st)
	}
	f.clock.Advance(1100 * time.Millisecond)
	if a, err := a3.publish(t, "x/2", "5", 1); err != nil || a.code != 0 {
		t.Fatalf("after the window: 0x%02x %v", a.code, err)
	}
	if g := f.srv.Groups(); len(g) != 2 || g[0].Name != "acme" || g[0].Connected != 2 || g[1].Name != "beta" {
		t.Fatalf("groups %+v", g)
	}
}

// TestGroupRefusalDisconnects: under policy disconnect a refusal by the
// group ends the MQTT 5 device's connection with DISCONNECT 0x96 whose
// reason names the group.
func TestGroupRefusalDisconnects(t *testing.T) {
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{tenantRule(devicelimit.PolicyDisconnect)}})
	p := f.connect(t, 5, "t-acme-1", "")
	for i := range 3 {
		if a, err := p.publish(t, "x/1", "ok", 1); err != nil || a.code != 0 {
			t.Fatalf("publish %d: 0x%02x %v", i, a.code, err)
		}
	}
	p.send("x/1", "over", 1)
	receive(t, "the connection to end", p.lost())
	eventually(t, "DISCONNECT", func() bool { return p.disconnect() != nil })
	if d := p.disconnect(); d.ReasonCode != 0x96 || d.Properties == nil ||
		!strings.HasPrefix(d.Properties.ReasonString, "message rate of group acme too high: 3 messages per 1s, retry after ") {
		t.Fatalf("DISCONNECT %+v", d)
	}
}

// TestGroupRefusalsDoNotBlock: a device the group refuses again and
// again (its tenant at its cap) is not blocked; one its own quota
// refuses as often is.
func TestGroupRefusalsDoNotBlock(t *testing.T) {
	r := tenantRule(devicelimit.PolicyDrop)
	r.Quota.Limit = 4
	r.Quota.Block = devicelimit.Block{After: 3, Within: time.Minute, For: time.Hour}
	r.Group.Quota.Limit = 100
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{r}})
	// A group override of 1 message: the tenant is at its cap at once.
	if err := f.resolver.SetOverride(devicelimit.GroupKey("acme"), devicelimit.Override{Quota: devicelimit.Quota{Limit: 1, Window: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	calm := f.connect(t, 5, "t-acme-1", "")
	for i := range 6 {
		want := byte(0x97)
		if i == 0 {
			want = 0
		}
		if a, err := calm.publish(t, "x/1", "m", 1); err != nil || a.code != want {
			t.Fatalf("message %d: 0x%02x %v, want 0x%02x", i, a.code, err, want)
		}
	}
	if st := f.srv.Stats(); st.Blocks != 0 {
		t.Fatalf("%d blocks for refusals by the group", st.Blocks)
	}
	// Its own quota's refusals do block: 4 admitted, 3 refused.
	other := f.connect(t, 5, "t-beta-1", "")
	for range 7 {
		other.send("x/2", "m", 1)
	}
	eventually(t, "the flooding device blocked", func() bool { return f.srv.Stats().Blocks == 1 })
}

// TestGroupCountsWhatItAdmits: with the device's quota in shadow mode and
// its group's enforced, the group decides first; a message the group
// admits and the device's windows would refuse passes, and the group
// counts it admitted.
func TestGroupCountsWhatItAdmits(t *testing.T) {
	r := tenantRule(devicelimit.PolicyDrop)
	r.Quota.Limit, r.Quota.Shadow = 1, true
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{r}})
	p := f.connect(t, 5, "t-acme-1", "")
	for i := range 4 {
		want := byte(0)
		if i == 3 {
			want = 0x97 // the group's 3 used: refused, enforced
		}
		if a, err := p.publish(t, "x/1", "m", 1); err != nil || a.code != want {
			t.Fatalf("message %d: 0x%02x %v, want 0x%02x", i, a.code, err, want)
		}
	}
	st := f.srv.Stats()
	if g := st.Groups["{tenant}"]; g[GroupAdmitted] != 3 || g[GroupRefused] != 1 || st.WouldRefuse != 2 {
		t.Fatalf("group stats %v, would-refuse %d; want 3 admitted, 1 refused, 2 would-refuse", g, st.WouldRefuse)
	}
}

// TestGroupMadeWithTwoQuotasLogged: two rules whose templates make the
// same group with different quotas (the configuration cannot know: the
// names come from client IDs) are told once in the log, naming both.
func TestGroupMadeWithTwoQuotasLogged(t *testing.T) {
	h := new(logtest.Capture)
	a := devicelimit.Rule{Name: "a", ClientID: "a-{tenant}-*", Quota: devicelimit.Quota{Limit: 10, Window: time.Second},
		Group: &devicelimit.Group{Name: "{tenant}", Quota: devicelimit.Quota{Limit: 3, Window: time.Second}}}
	b := a
	b.Name, b.ClientID = "b", "b-{tenant}-*"
	b.Group = &devicelimit.Group{Name: "{tenant}", Quota: devicelimit.Quota{Limit: 5, Window: time.Second}}
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{a, b}, logger: slog.New(h)})
	const msg = "group made by two rules with different quotas; each message is judged by its device's rule's: give one group one quota"
	f.connect(t, 5, "a-acme-1", "")
	f.connect(t, 5, "a-acme-2", "")
	if n := h.Count(msg); n != 0 {
		t.Fatalf("%d warnings for one rule's devices", n)
	}
	f.connect(t, 5, "b-acme-1", "")
	f.connect(t, 5, "b-acme-2", "")
	got := h.All(msg)
	if len(got) != 1 || got[0]["group"] != "acme" || got[0]["first"] != "3 messages per 1s" || got[0]["now"] != "5 messages per 1s" {
		t.Fatalf("warnings %v, want one naming acme, 3 and 5 messages per 1s", got)
	}
}

// TestJoinGroupAllocatesNothing: every connection of a grouped device
// joins its group; once the group is known that costs no allocation
// (sync.Map's LoadOrStore boxed the membership on every call).
func TestJoinGroupAllocatesNothing(t *testing.T) {
	h := &throttle{}
	m := devicelimit.Membership{Name: "acme", Key: devicelimit.GroupKey("acme"), Quota: devicelimit.Quota{Limit: 3, Window: time.Second}}
	h.joinGroup(m, 0)
	if n := testing.AllocsPerRun(1000, func() { h.joinGroup(m, 0) }); n != 0 {
		t.Fatalf("%v allocations per join of a known group, want 0", n)
	}
}

// TestGroupsAfterReload: a reload that removes the groups' rule drops
// its groups from Groups, also the one a device connecting across the
// reload joined: its rules' lookup began before the reload (the rules'
// generation then) and its join came after the reload's walk, which
// once listed the removed group again. A join under the new rules is
// listed, and replaces a stale one of the same name.
func TestGroupsAfterReload(t *testing.T) {
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{tenantRule(devicelimit.PolicyDrop)}})
	f.connect(t, 5, "t-acme-1", "")
	if g := f.srv.Groups(); len(g) != 1 || g[0].Name != "acme" || g[0].Connected != 1 {
		t.Fatalf("groups before the reload %+v", g)
	}
	h := f.srv.hook
	before := f.resolver.Generation()
	_, _, _, stale := f.resolver.RuleGroup("t-beta-1", "") // a lookup begun before the reload

	n, err := devicelimit.NewResolver(generous, nil, testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.resolver.Reconfigure(n); err != nil {
		t.Fatal(err)
	}
	f.srv.Reconfigure()
	h.joinGroup(stale, before) // ... whose join comes after the reload's walk
	if g := f.srv.Groups(); len(g) != 0 {
		t.Fatalf("groups after a reload removed their rule: %+v", g)
	}

	// The rule back: a device joining now is listed, over the stale entry.
	back, err := devicelimit.NewResolver(generous, []devicelimit.Rule{tenantRule(devicelimit.PolicyDrop)}, testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.resolver.Reconfigure(back); err != nil {
		t.Fatal(err)
	}
	f.srv.Reconfigure()
	h.joinGroup(stale, before)
	f.connect(t, 5, "t-beta-1", "")
	if g := f.srv.Groups(); len(g) != 2 || g[0].Name != "acme" || g[0].Connected != 1 || g[1].Name != "beta" || g[1].Connected != 1 {
		t.Fatalf("groups after the rule came back %+v", g)
	}
}
