package devicelimit

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// groupSequences is the number of generated sequences of
// TestPropertyGroupWindowsHold (a tenth under the race detector).
const groupSequences = 6_000

// groupMsg is one message of a group's property sequence.
type groupMsg struct {
	sent
	dev int
}

// TestPropertyGroupWindowsHold: 2 to 5 devices of one group, each with
// random windows of its own and the group with random windows (1 to 4,
// messages and bytes), in random modes (both enforced, both in shadow
// mode, one of them in shadow mode): what each part's windows count
// never exceeds a window's limit in any interval of its length, and
// what passes never exceeds an enforced part's limits.
func TestPropertyGroupWindowsHold(t *testing.T) {
	tables := tableSet{}
	forEachSeq(t, 21, groupSequences/raceScale, func(seq int, r *rand.Rand) {
		buckets := 1 + r.IntN(40)
		tab := tables.get(t, buckets)
		group := GroupKey(fmt.Sprint("tenant-", seq))
		gq := WithWindows(PolicyDrop, randomLimits(r, buckets)...)
		devs := make([]string, 2+r.IntN(4))
		qs := make([]Quota, len(devs))
		var msgs []groupMsg
		mode := r.IntN(4) // 0 enforced, 1 both shadow, 2 device shadow, 3 group shadow
		gq.Shadow = mode == 1 || mode == 3
		for i := range devs {
			devs[i] = fmt.Sprintf("dev-%d-%d", seq, i)
			qs[i] = WithWindows(PolicyDrop, randomLimits(r, buckets)...)
			qs[i].Shadow = mode == 1 || mode == 2
			for _, m := range multiArrivals(r, slices.Concat(qs[i].Limits(), gq.Limits()), buckets) {
				msgs = append(msgs, groupMsg{m, i})
			}
		}
		sort.SliceStable(msgs, func(i, j int) bool { return msgs[i].at < msgs[j].at })
		// counted[i] are the messages device i's windows counted, the
		// group's what its windows counted; passed are those let through.
		counted := make([][]sent, len(devs))
		var groupCounted, passed []sent
		devPassed := make([][]sent, len(devs))
		for _, m := range msgs {
			q := qs[m.dev]
			devAdmits := tab.PeekAllAt(devs[m.dev], "", q.Limits(), m.size, m.at).Allowed
			grpAdmits := tab.PeekAllAt(group, "", gq.Limits(), m.size, m.at).Allowed
			d := tab.AllowGroupAt(devs[m.dev], "", q, group, gq, m.size, m.at)
			// What each part counts, by the documented order.
			var devCounts, grpCounts bool
			switch mode {
			case 0, 1:
				devCounts, grpCounts = devAdmits && grpAdmits, devAdmits && grpAdmits
			case 2: // the group (enforced) first
				grpCounts, devCounts = grpAdmits, grpAdmits && devAdmits
			case 3:
				devCounts, grpCounts = devAdmits, devAdmits && grpAdmits
			}
			if d.Allowed != (devAdmits && grpAdmits) {
				t.Fatalf("seq %d mode %d: Allowed %v, device admits %v, group admits %v", seq, mode, d.Allowed, devAdmits, grpAdmits)
			}
			bothRefuse := !devAdmits && !grpAdmits && mode <= 1 // the one that admits last
			if !d.Allowed && !bothRefuse && d.Group != (mode == 3 && devAdmits || mode != 3 && devAdmits && !grpAdmits || mode == 2 && !grpAdmits) {
				t.Fatalf("seq %d mode %d: refused with Group %v; device admits %v, group admits %v", seq, mode, d.Group, devAdmits, grpAdmits)
			}
			if devCounts {
				counted[m.dev] = append(counted[m.dev], m.sent)
			}
			if grpCounts {
				groupCounted = append(groupCounted, m.sent)
			}
			refusedBy := q.Shadow
			if d.Group {
				refusedBy = gq.Shadow
			}
			if d.Allowed || refusedBy {
				passed = append(passed, m.sent)
				devPassed[m.dev] = append(devPassed[m.dev], m.sent)
			}
		}
		what := fmt.Sprintf("seq %d mode %d buckets %d", seq, mode, buckets)
		for _, l := range gq.Limits() {
			checkLimit(t, groupCounted, l, what+" group counted")
			if !gq.Shadow {
				checkLimit(t, passed, l, what+" group passed")
			}
		}
		for i := range devs {
			for _, l := range qs[i].Limits() {
				checkLimit(t, counted[i], l, what+" device counted")
				if !qs[i].Shadow {
					checkLimit(t, devPassed[i], l, what+" device passed")
				}
			}
		}
		for i := range devs {
			tab.Reset(devs[i])
		}
		tab.Reset(group)
	})
}

// TestGroupDecisionAllocatesNothing: a grouped decision on windows that
// exist allocates nothing.
func TestGroupDecisionAllocatesNothing(t *testing.T) {
	tab := newTable(t, 20)
	q := Quota{Limit: 1000, Window: time.Second}
	gq := WithWindows(PolicyDrop, Limit{Unit: Messages, N: 100, Window: time.Second}, Limit{Unit: Bytes, N: 1 << 20, Window: time.Minute})
	key := GroupKey("acme")
	now := t0
	tab.AllowGroupAt("dev", "", q, key, gq, 10, now)
	if n := testing.AllocsPerRun(200, func() {
		now = now.Add(ms)
		tab.AllowGroupAt("dev", "", q, key, gq, 10, now)
	}); n != 0 {
		t.Fatalf("AllowGroupAt allocates %v per call", n)
	}
	// Nor does looking up the group's quota, override or not.
	r, err := NewResolver(q, []Rule{{ClientID: "t-{tenant}-*", Quota: q, Group: &Group{Name: "{tenant}", Quota: gq}}}, 20)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("acme", 10) // past a concatenation's 32-byte stack buffer
	m := r.GroupOf("t-"+long+"-1", "")
	if err := r.SetOverride("other", Override{Quota: q}); err != nil {
		t.Fatal(err)
	}
	for _, over := range []bool{false, true} {
		if over {
			if err := r.SetOverride(GroupKey(long), Override{Quota: gq}); err != nil {
				t.Fatal(err)
			}
		}
		if n := testing.AllocsPerRun(200, func() { r.GroupQuotaAt(m, now) }); n != 0 {
			t.Fatalf("GroupQuotaAt (group override %v) allocates %v per call", over, n)
		}
	}
}

// TestGroupWindowsKeyedApart: a group's windows are kept apart from a
// device of the same name, restored from a snapshot, and reset alone.
func TestGroupWindowsKeyedApart(t *testing.T) {
	tab := newTable(t, 10)
	q := Quota{Limit: 5, Window: time.Second}
	gq := Quota{Limit: 2, Window: time.Second}
	key := GroupKey("acme")
	for i := range 3 {
		d := tab.AllowGroupAt("acme", "", q, key, gq, 1, t0)
		if d.Allowed != (i < 2) || !d.Allowed && !d.Group {
			t.Fatalf("message %d: %+v", i, d)
		}
	}
	if got := tab.PeekAt("acme", q, t0); got.Count != 2 {
		t.Fatalf("device acme holds %d, want 2", got.Count)
	}
	if got := tab.PeekGroupAt(key, gq, 1, t0); got.Allowed || got.Windows[0].Count != 2 {
		t.Fatalf("group acme: %+v", got)
	}
	snap, ok := tab.Snapshot(key)
	if !ok {
		t.Fatal("no snapshot of the group's window")
	}
	dev, _ := tab.Snapshot("acme")
	tab2 := newTable(t, 10)
	if err := tab2.Restore(key, snap); err != nil {
		t.Fatal(err)
	}
	if err := tab2.Restore("acme", dev); err != nil {
		t.Fatal(err)
	}
	if got := tab2.PeekGroupAt(key, gq, 1, t0); got.Windows[0].Count != 2 {
		t.Fatalf("restored group: %+v", got)
	}
	if !tab2.Reset(key) || tab2.PeekGroupAt(key, gq, 1, t0).Windows[0].Count != 0 {
		t.Fatal("group not reset")
	}
	if tab2.PeekAt("acme", q, t0).Count != 2 {
		t.Fatal("resetting the group reset the device of its name")
	}
}

func TestGlobCapture(t *testing.T) {
	for _, c := range []struct {
		pattern, s string
		want       []string
	}{
		{"tenant-{tenant}-*", "tenant-acme-7", []string{"acme"}},
		{"tenant-{tenant}-*", "tenant-acme-x-7", []string{"acme"}},
		{"{site}/{kind}", "berlin/temp", []string{"berlin", "temp"}},
		{"*-{n}", "a-b-c", []string{"b-c"}},
		{"x{rest}", "xyz", []string{"yz"}},
		{"{a}?z", "abz", []string{"a"}},
		{"{all}", "", []string{""}},
	} {
		g, err := CompileGlob(c.pattern)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := g.Capture(c.s)
		if !ok || !slices.Equal(got, c.want) || !g.Match(c.s) {
			t.Errorf("%q.Capture(%q) = %q %v, want %q", c.pattern, c.s, got, ok, c.want)
		}
	}
	g, _ := CompileGlob("tenant-{tenant}-*")
	if _, ok := g.Capture("other-acme-1"); ok || g.Match("other-acme-1") {
		t.Error("matched a client ID outside the pattern")
	}
	if g, _ := CompileGlob("dev{1}"); !g.Match("dev{1}") || len(g.Names()) != 0 {
		t.Error(`"{1}" is not a name: literal`)
	}
	if _, err := CompileGlob("{a}-{a}"); !errors.Is(err, ErrInvalidPattern) {
		t.Errorf("a part named twice: %v", err)
	}
}

func TestGroupOf(t *testing.T) {
	rules := []Rule{
		{Name: "tenants", ClientID: "tenant-{tenant}-*", Quota: Quota{Limit: 10, Window: time.Second},
			Group: &Group{Name: "{tenant}", Quota: Quota{Limit: 100, Window: 10 * time.Second}}},
		{Name: "fleet", Username: "?*", Quota: Quota{Limit: 10, Window: time.Second},
			Group: &Group{Name: "user-{username}", Quota: Quota{Limit: 50, Window: time.Second, Shadow: true}}},
	}
	r, err := NewResolver(Quota{Limit: 1, Window: time.Second}, rules, 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetDefaultGroup(&Group{Name: "everyone", Quota: Quota{Limit: 1000, Window: time.Second}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ cid, user, want, label string }{
		{"tenant-acme-1", "", "acme", "{tenant}"},
		{"sensor", "bob", "user-bob", "user-{username}"},
		{"sensor", "", "everyone", "everyone"},
	} {
		m := r.GroupOf(c.cid, c.user)
		if m.Name != c.want || m.Label != c.label {
			t.Errorf("GroupOf(%q, %q) = %+v, want %q labelled %q", c.cid, c.user, m, c.want, c.label)
		}
	}
	if got := r.GroupLabels(); !slices.Equal(got, []string{"everyone", "{tenant}", "user-{username}"}) {
		t.Errorf("labels %q", got)
	}
	m := r.GroupOf("tenant-acme-1", "")
	if err := r.SetOverride(GroupKey("acme"), Override{Quota: Quota{Limit: 7, Window: time.Second}}); err != nil {
		t.Fatal(err)
	}
	if q := r.GroupQuotaAt(m, t0); q.Limit != 7 {
		t.Errorf("group override not in force: %v", q)
	}
	for _, bad := range []struct {
		rule Rule
		want string
	}{
		{Rule{ClientID: "t-{tenant}-*", Quota: Quota{Limit: 1, Window: time.Second}, Group: &Group{Name: "{tenat}", Quota: Quota{Limit: 1, Window: time.Second}}}, "names the part {tenat}"},
		{Rule{ClientID: "t-*", Quota: Quota{Limit: 1, Window: time.Second}, Group: &Group{Name: "g", Quota: Quota{Limit: 0, Window: time.Second}}}, "group.quota.limit"},
		{Rule{ClientID: "t-*", Quota: Quota{Limit: 1, Window: time.Second}, Group: &Group{Name: "g", Quota: Quota{Limit: 1, Window: time.Second, Block: Block{After: 1, Within: time.Second, For: time.Second}}}}, "a group has no block"},
		{Rule{ClientID: "{username}-*", Quota: Quota{Limit: 1, Window: time.Second}, Group: &Group{Name: "g", Quota: Quota{Limit: 1, Window: time.Second}}}, "named twice"},
	} {
		if _, err := NewResolver(Quota{Limit: 1, Window: time.Second}, []Rule{bad.rule}, 10); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: error %v, want one saying %q", bad.rule, err, bad.want)
		}
	}
}

// TestTemplateCouldMake: which names a group template can expand to.
func TestTemplateCouldMake(t *testing.T) {
	parts := []string{"tenant", PartUsername}
	for _, tc := range []struct {
		tmpl, name string
		want       bool
	}{
		{"{tenant}", "anything", true},
		{"tenant-{tenant}", "tenant-acme", true},
		{"tenant-{tenant}", "acme", false},
		{"fleet", "fleet", true},
		{"fleet", "fleets", false},
		{"{tenant}-{username}-x", "a-b-x", true},
		{"{tenant}-{username}-x", "a-b-y", false},
	} {
		tm, err := CompileTemplate(tc.tmpl, parts)
		if err != nil {
			t.Fatal(err)
		}
		if got := tm.CouldMake(tc.name); got != tc.want {
			t.Errorf("%q could make %q: %v, want %v", tc.tmpl, tc.name, got, tc.want)
		}
	}
}
