package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// grantOwner is newOwner with its grants on the decisions' ticks (the
// injected clock) instead of Redis's TIME.
func grantOwner(t testing.TB, srv *redistest.Server, buckets int) *ownerRig {
	t.Helper()
	g := newOwner(t, srv, buckets, 3*time.Second)
	g.o.grants.explicit = true
	return g
}

// groupRun is one group of a grant test: its key, its quota, and the
// instants it admitted (one per message, and one per byte).
type groupRun struct {
	key             string
	gq              devicelimit.Quota
	admitted, bytes []devicelimit.Tick
}

// check fails t when an interval of T of any of g's windows holds more
// than N.
func (g *groupRun) check(t *testing.T) {
	t.Helper()
	for i, l := range g.gq.Limits() {
		got := g.admitted
		if l.Unit == devicelimit.Bytes {
			got = g.bytes
		}
		checkWindows(t, got, devicelimit.Quota{Limit: l.N, Window: l.Window}, fmt.Sprintf("group %q window %d", g.key[1:], i))
	}
}

// record counts an admission of size bytes at now.
func (g *groupRun) record(now devicelimit.Tick, size int) {
	g.admitted = append(g.admitted, now)
	for range size {
		g.bytes = append(g.bytes, now)
	}
}

// testGroups are the property tests' groups: one message window, and a
// message and a byte window of other lengths.
func testGroups() []*groupRun {
	return []*groupRun{
		{key: devicelimit.GroupKey("acme"), gq: devicelimit.Quota{Limit: 40, Window: time.Second}},
		{key: devicelimit.GroupKey("globex"), gq: devicelimit.Quota{NWindows: 2, Windows: [devicelimit.MaxWindows]devicelimit.Limit{
			{Unit: devicelimit.Messages, N: 25, Window: 800 * time.Millisecond},
			{Unit: devicelimit.Bytes, N: 1500, Window: 500 * time.Millisecond},
		}}},
	}
}

// groupProperty drives 12 devices of two groups through the gateways
// gws at random instants of an injected clock (regimes far over the
// groups' quotas, near them and under them, jumps of seconds), moving devices
// between gateways and, when crash is set, crashing a gateway now and
// then (crash returns its replacement). Every interval of T of every
// group window must hold at most N admissions, whichever gateways
// admitted them, and the grants must have decided most messages.
func groupProperty(t *testing.T, gws []*Owner, crash func(i int) *Owner, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 38))
	q := devicelimit.Quota{Limit: 100000, Window: time.Second} // the devices' own: never binding
	groups := testGroups()
	const devices = 12
	on := make([]int, devices)
	for d := range on {
		on[d] = d % len(gws)
	}
	now := t0
	moves, crashes, refused, drops := 0, 0, 0, 0
	gap := 4 * time.Millisecond
	for step := range 6000 {
		if step%150 == 0 {
			// A new regime: far over the quotas, near them, or under
			// them (grants then are dated ahead and used over their span).
			gap = [...]time.Duration{4 * time.Millisecond, 30 * time.Millisecond, 60 * time.Millisecond}[r.IntN(3)]
		}
		if r.IntN(300) == 0 {
			now = now.Add(time.Duration(r.IntN(2000)) * time.Millisecond)
		} else {
			now = now.Add(time.Duration(r.Int64N(int64(gap))))
		}
		d := r.IntN(devices)
		switch x := r.IntN(1000); {
		case x < 10:
			on[d] = r.IntN(len(gws))
			moves++
		case x < 14 && crash != nil:
			i := r.IntN(len(gws))
			gws[i] = crash(i)
			crashes++
		case x >= 20 && x < 30:
			// A sweep of idle grant entries (ownergroupback.go), idle
			// here after 300 ms: their rests given back, the next
			// decision claims anew.
			o := gws[r.IntN(len(gws))]
			drops += o.dropIdleGrants(context.Background(), o.grantNow(now), int64(300*time.Millisecond))
		}
		g := groups[d%len(groups)]
		size := 10 + r.IntN(60)
		v := gws[on[d]].AllowGroupAt(fmt.Sprint("dev-", d), "", q, g.key, g.gq, size, now)
		if !v.Allowed {
			refused++
			continue
		}
		g.record(now, size)
	}
	var grants, fallbacks uint64
	for _, o := range gws {
		grants += o.stats.grants.Load()
		fallbacks += o.stats.fallbacks.Load()
	}
	admitted := 0
	for _, g := range groups {
		g.check(t)
		admitted += len(g.admitted)
		if len(g.admitted) < 300 {
			t.Errorf("group %q admitted only %d", g.key[1:], len(g.admitted))
		}
	}
	t.Logf("%d admitted, %d refused, %d grant claims (of the last gateways), %d moves, %d crashes, %d idle grant entries dropped, over %v",
		admitted, refused, grants, moves, crashes, drops, now.Sub(t0))
	if drops == 0 {
		t.Error("no idle grant entry was dropped")
	}
	if fallbacks != 0 {
		t.Errorf("%d decisions fell back to the failure policy", fallbacks)
	}
}

// TestOwnerGroupGrantsProperty: three in-process gateways of owner mode
// on one real redis-server decide the devices of two groups on their
// grants; devices move and gateways crash (their grants are lost, never
// returned). No interval of T holds more than N, in messages or bytes.
func TestOwnerGroupGrantsProperty(t *testing.T) {
	srv := redistest.Start(t)
	const buckets = 10
	gws := []*Owner{grantOwner(t, srv, buckets).o, grantOwner(t, srv, buckets).o, grantOwner(t, srv, buckets).o}
	crashOne := func(i int) *Owner {
		crash(t, srv, &ownerRig{o: gws[i]})
		return grantOwner(t, srv, buckets).o
	}
	groupProperty(t, gws, crashOne, 3)
}

// TestOwnerGroupGrantsRedisCluster is the property test on a real
// three-master Redis Cluster (a group's grant rings share its hash tag:
// one slot), without crashes.
func TestOwnerGroupGrantsRedisCluster(t *testing.T) {
	rc := redistest.StartCluster(t, 3)
	cfg := Config{Addrs: rc.Addrs(), Timeout: time.Second}
	gws := []*Owner{ownerOn(t, cfg), ownerOn(t, cfg)}
	for _, o := range gws {
		o.grants.explicit = true
	}
	groupProperty(t, gws, nil, 5)
}

// TestOwnerGroupCommandsPerMessage: a group whose devices stay on two
// gateways costs Redis at most 0.05 commands per admitted message at
// steady state, counted by Redis's own INFO commandstats (the grant
// claims, give-backs riding on them, the devices' checkpoints and the
// liveness renewals): 20 devices at 2 messages a second each, in a
// group of 6,000 a minute.
func TestOwnerGroupCommandsPerMessage(t *testing.T) {
	srv := redistest.Start(t)
	groupCommands(t, [2]*Owner{grantOwner(t, srv, 10).o, grantOwner(t, srv, 10).o}, false, func() int64 { return commandCount(t, srv) })
}

// TestOwnerGroupCommandsRedisCluster is TestOwnerGroupCommandsPerMessage
// on a real three-master Redis Cluster, the commands summed over the
// masters (the clients' slot-map reads included).
func TestOwnerGroupCommandsRedisCluster(t *testing.T) {
	rc := redistest.StartCluster(t, 3)
	cfg := Config{Addrs: rc.Addrs(), Timeout: time.Second}
	gws := [2]*Owner{ownerOn(t, cfg), ownerOn(t, cfg)}
	for _, o := range gws {
		o.grants.explicit = true
	}
	groupCommands(t, gws, false, func() int64 {
		var n int64
		for _, node := range rc.Nodes {
			n += commandCount(t, node)
		}
		return n
	})
}

// groupCommands runs the steady state of the group cost tests on gws,
// count reading Redis's commands so far; with standing, each message's
// standing is asked after its decision, as the broker does for an MQTT 5
// device's QoS 1 publish (broker/feedback.go).
func groupCommands(t *testing.T, gws [2]*Owner, standing bool, count func() int64) {
	t.Helper()
	q := devicelimit.Quota{Limit: 1000, Window: time.Minute}
	group := devicelimit.GroupKey("acme")
	gq := devicelimit.Quota{Limit: 6000, Window: time.Minute}
	const devices, rounds = 20, 1200
	now := t0
	run := &groupRun{key: group, gq: gq}
	var s devicelimit.Standing
	publish := func(rounds int) int {
		admitted := 0
		for range rounds {
			for d := range devices {
				dev := fmt.Sprint("dev-", d)
				v := gws[d%2].AllowGroupAt(dev, "", q, group, gq, 10, now)
				if v.Allowed {
					admitted++
					run.record(now, 0)
				}
				if standing {
					gws[d%2].StandingAt(dev, "", q, group, gq, 10, !v.Allowed, now, &s)
					if _, ok := groupWindow(&s); !ok {
						t.Fatalf("no group window in the standing of %s: %+v", dev, s)
					}
				}
			}
			now = now.Add(500 * time.Millisecond)
		}
		return admitted
	}
	publish(200) // claims, first checkpoints, grants grown
	claims0 := gws[0].stats.grants.Load() + gws[1].stats.grants.Load()
	before := count()
	admitted := publish(rounds)
	cmds := count() - before
	claims := gws[0].stats.grants.Load() + gws[1].stats.grants.Load() - claims0
	per := float64(cmds) / float64(max(admitted, 1))
	t.Logf("%d commands for %d admitted messages: %.4f per message (%d grant claims, fallbacks %d and %d)",
		cmds, admitted, per, claims, gws[0].stats.fallbacks.Load(), gws[1].stats.fallbacks.Load())
	if admitted != rounds*devices {
		t.Fatalf("admitted %d of %d", admitted, rounds*devices)
	}
	if per > 0.05 {
		t.Fatalf("%.4f redis commands per admitted message, want at most 0.05", per)
	}
	run.check(t)
}

// TestOwnerGroupSharedFairly: a group far over its quota from two
// gateways is shared between them. Equal demand: each gateway gets at
// least 30% of what the group admitted; one gateway sending four times
// as often as the other: the lighter one still gets at least 10% (its
// share of the demand is 20%). The group admits at least half its
// capacity over the run (grants in flight and given back do not waste
// more), and no interval of T holds more than N.
func TestOwnerGroupSharedFairly(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name     string
		a, b     int // messages per step from each gateway
		minShare float64
	}{{"equal", 1, 1, 0.3}, {"four to one", 4, 1, 0.1}} {
		t.Run(tc.name, func(t *testing.T) {
			gws := [2]*ownerRig{grantOwner(t, srv, 10), grantOwner(t, srv, 10)}
			q := devicelimit.Quota{Limit: 100000, Window: time.Second}
			gq := devicelimit.Quota{Limit: 20, Window: time.Second}
			run := &groupRun{key: devicelimit.GroupKey("fair-" + tc.name), gq: gq}
			now := t0
			var got [2]int
			const steps = 4000
			for s := range steps {
				for i, n := range [2]int{tc.a, tc.b} {
					for k := range n {
						dev := fmt.Sprintf("gw%d-dev-%d", i, (s+k)%4)
						if gws[i].o.AllowGroupAt(dev, "", q, run.key, gq, 10, now).Allowed {
							got[i]++
							run.record(now, 0)
						}
					}
				}
				now = now.Add(5 * time.Millisecond)
			}
			run.check(t)
			total := got[0] + got[1]
			capacity := int(now.Sub(t0)/gq.Window) * gq.Limit
			t.Logf("admitted %d on A, %d on B (capacity %d over %v)", got[0], got[1], capacity, now.Sub(t0))
			for i, n := range got {
				if float64(n) < tc.minShare*float64(total) {
					t.Errorf("gateway %d admitted %d of %d: starved (want at least %.0f%%)", i, n, total, 100*tc.minShare)
				}
			}
			if 2*total < capacity {
				t.Errorf("admitted %d, less than half the capacity %d", total, capacity)
			}
		})
	}
}

// TestOwnerGroupDecisionAllocs: a group decision on this gateway's
// grant (the device's own within its lease) allocates nothing.
func TestOwnerGroupDecisionAllocs(t *testing.T) {
	srv := redistest.Start(t)
	g := grantOwner(t, srv, 10)
	q := devicelimit.Quota{Limit: devicelimit.MaxLimit, Window: time.Minute}
	gq := devicelimit.Quota{Limit: devicelimit.MaxLimit, Window: time.Minute}
	group := devicelimit.GroupKey("acme")
	gs := g.o.grantsOf(group)
	left := func() int64 { gs.mu.Lock(); defer gs.mu.Unlock(); return gs.w[0].left }
	for i := 0; left() < 2000; i++ {
		if i > 100000 {
			t.Fatalf("grant never grew past %d", left())
		}
		if !g.o.AllowGroupAt("d", "", q, group, gq, 10, t0).Allowed {
			t.Fatal("refused")
		}
	}
	claims := g.o.stats.grants.Load()
	if n := testing.AllocsPerRun(1000, func() { g.o.AllowGroupAt("d", "", q, group, gq, 10, t0) }); n != 0 {
		t.Fatalf("%v allocations per group decision on a grant", n)
	}
	if c := g.o.stats.grants.Load(); c != claims {
		t.Fatalf("%d claims during the measured decisions", c-claims)
	}
}

// TestOwnerGroupStanding: any gateway's admin API reads a group's
// windows from its grant rings: another gateway's admissions (and the
// rest of its grant) show as counted; a full group shows when it admits
// again.
func TestOwnerGroupStanding(t *testing.T) {
	srv := redistest.Start(t)
	a, b := grantOwner(t, srv, 10), grantOwner(t, srv, 10)
	q := devicelimit.Quota{Limit: 1000, Window: time.Minute}
	gq := devicelimit.Quota{Limit: 100, Window: time.Minute}
	group := devicelimit.GroupKey("acme")
	for i := range 10 {
		if !a.o.AllowGroupAt("d", "", q, group, gq, 10, t0).Allowed {
			t.Fatalf("message %d refused", i)
		}
	}
	var s devicelimit.Standing
	b.o.StandingAt("e", "", q, group, gq, 10, false, t0, &s)
	w, ok := groupWindow(&s)
	if !ok || w.Remaining > 90 || w.Remaining < 100-10-100/grantCapDiv || w.Reset <= 0 {
		t.Fatalf("group standing on B after 10 on A: %+v (found %v); want 78..90 remaining and a reset", w, ok)
	}
	for b.o.AllowGroupAt("e", "", q, group, gq, 10, t0).Allowed {
	}
	b.o.StandingAt("e", "", q, group, gq, 10, true, t0, &s)
	if w, ok := groupWindow(&s); !ok || w.Remaining != 0 || w.Reset <= 0 || w.Reset > time.Minute+gq.Window/10*3 {
		t.Fatalf("full group's standing: %+v (found %v); want 0 remaining and a reset within T and a span", w, ok)
	}
}

// groupWindow returns the group's window of s.
func groupWindow(s *devicelimit.Standing) (devicelimit.WindowStanding, bool) {
	for _, w := range s.Windows[:s.N] {
		if w.Group {
			return w, true
		}
	}
	return devicelimit.WindowStanding{}, false
}

// BenchmarkOwnerGroupAllowAt is a decision of owner mode on devices of
// one group this gateway owns, on its grant (production clocks: Redis's
// TIME and the monotonic clock); BenchmarkTableGroupAllowAt the same
// decisions on a standalone gateway's table: the two side by side are
// what group grants cost per message on the gateway:
//
//	go test -run '^$' -bench 'GroupAllowAt' -count 5 ./cluster/
func BenchmarkOwnerGroupAllowAt(b *testing.B) {
	srv := redistest.Start(b)
	g := newOwner(b, srv, 20, time.Second)
	benchDecisions(b, groupAllow(g.o.AllowGroupAt))
}

func BenchmarkTableGroupAllowAt(b *testing.B) {
	tab, err := devicelimit.NewTable(20)
	if err != nil {
		b.Fatal(err)
	}
	benchDecisions(b, groupAllow(tab.AllowGroupAt))
}

// groupAllow makes a group decision (of group acme, MaxLimit a minute)
// a device decision for benchDecisions.
func groupAllow(allow func(string, string, devicelimit.Quota, string, devicelimit.Quota, int, devicelimit.Tick) devicelimit.GroupDecision) func(string, devicelimit.Quota, devicelimit.Tick) devicelimit.Decision {
	group := devicelimit.GroupKey("acme")
	gq := devicelimit.Quota{Limit: devicelimit.MaxLimit, Window: time.Minute}
	return func(dev string, q devicelimit.Quota, now devicelimit.Tick) devicelimit.Decision {
		return allow(dev, "", q, group, gq, 10, now).Decision
	}
}

// TestOwnerGroupShadowMatchesTable: a device of a group decided on
// grants answers as a standalone gateway's table does, message by
// message, with both parts enforced, both in shadow mode, and either
// one in shadow mode (the enforced part first, the other counted only
// when it admitted).
func TestOwnerGroupShadowMatchesTable(t *testing.T) {
	srv := redistest.Start(t)
	g := grantOwner(t, srv, 10)
	for _, tc := range []struct {
		name           string
		device, shadow bool
	}{{"both enforced", false, false}, {"both shadow", true, true}, {"device shadow", true, false}, {"group shadow", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			tab, err := devicelimit.NewTable(10)
			if err != nil {
				t.Fatal(err)
			}
			q := devicelimit.Quota{Limit: 6, Window: time.Hour, Shadow: tc.device}
			gq := devicelimit.Quota{Limit: 4, Window: time.Hour, Shadow: tc.shadow}
			group := devicelimit.GroupKey("shadow-" + tc.name)
			dev := "dev-" + tc.name
			for i := range 10 {
				now := t0.Add(time.Duration(i) * time.Millisecond)
				got := g.o.AllowGroupAt(dev, "", q, group, gq, 10, now)
				want := tab.AllowGroupAt(dev, "", q, group, gq, 10, now)
				if got.Allowed != want.Allowed || got.Group != want.Group || got.Count != want.Count {
					t.Fatalf("message %d: owner %+v, table %+v", i, got, want)
				}
			}
		})
	}
}
