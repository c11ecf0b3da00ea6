package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// TestOwnerGroupStandingCommandsPerMessage is
// TestOwnerGroupCommandsPerMessage with every message's standing asked
// after its decision (an MQTT 5 device's QoS 1 publish, whatever its
// feedback mode): the group's standing comes from what the gateway's
// last claim or look said, so it stays within 0.05 Redis commands per
// admitted message (the grant script's GET and TIME counted).
func TestOwnerGroupStandingCommandsPerMessage(t *testing.T) {
	srv := redistest.Start(t)
	groupCommands(t, [2]*Owner{grantOwner(t, srv, 10).o, grantOwner(t, srv, 10).o}, true, func() int64 { return commandCount(t, srv) })
}

// TestOwnerGroupStandingTruth: two gateways share a group of a message
// and a byte window under an injected clock, at random instants in
// regimes over, near and under the quota. After each of gateway A's
// decisions its standing of the group is asked: every window's
// Remaining is at most N less what both gateways admitted in the window
// ending at the instant of the reply it came from (the claim's or
// look's A noted), and that reply is at most a bucket (T/B) old unless
// a refusal's retry-after answered; a window without room for a
// refused message tells a retry-after within T and the furthest grant's
// span, the refusing claim's when the group refused (the verdict's).
// Then B fills the group and A's refused message is admitted at the
// instant its standing said.
func TestOwnerGroupStandingTruth(t *testing.T) {
	srv := redistest.Start(t)
	const buckets = 10
	a, b := grantOwner(t, srv, buckets).o, grantOwner(t, srv, buckets).o
	q := devicelimit.Quota{Limit: 100000, Window: time.Second}
	gq := devicelimit.Quota{NWindows: 2, Windows: [devicelimit.MaxWindows]devicelimit.Limit{
		{Unit: devicelimit.Messages, N: 60, Window: time.Second},
		{Unit: devicelimit.Bytes, N: 1200, Window: 700 * time.Millisecond},
	}}
	run := &groupRun{key: devicelimit.GroupKey("truth"), gq: gq}
	ls := gq.Limits()
	r := rand.New(rand.NewPCG(7, 38))
	now := t0
	var s devicelimit.Standing
	gap := 2 * time.Millisecond
	var cached, refusals, groupRefusals int
	for step := range 5000 {
		if step%200 == 0 {
			gap = [...]time.Duration{2 * time.Millisecond, 15 * time.Millisecond, 40 * time.Millisecond}[r.IntN(3)]
		}
		now = now.Add(time.Duration(r.Int64N(int64(gap))))
		size := 10 + r.IntN(60)
		if r.IntN(2) == 1 {
			if b.AllowGroupAt(fmt.Sprint("b-", r.IntN(4)), "", q, run.key, gq, size, now).Allowed {
				run.record(now, size)
			}
			continue
		}
		dev := fmt.Sprint("a-", r.IntN(4))
		v := a.AllowGroupAt(dev, "", q, run.key, gq, size, now)
		if v.Allowed {
			run.record(now, size)
		} else {
			refusals++
		}
		a.StandingAt(dev, "", q, run.key, gq, size, !v.Allowed, now, &s)
		gs := a.grantEntry(run.key)
		gs.mu.Lock()
		c := devicelimit.Tick(gs.noted)
		gs.mu.Unlock()
		if int64(c) == a.grantNow(now) {
			cached--
		}
		cached++
		var retried bool
		for i, l := range ls {
			w, ok := groupWindowOf(&s, l)
			if !ok {
				t.Fatalf("step %d: no group window %v in %+v", step, l, s)
			}
			got := run.admitted
			need := 1
			if l.Unit == devicelimit.Bytes {
				got, need = run.bytes, size
			}
			held := countIn(got, c.Add(-l.Window), c)
			if w.Remaining > l.N-held {
				t.Fatalf("step %d, window %d: A's standing says %d remaining, but %d of %d were admitted in the window ending at its reply (%v before)",
					step, i, w.Remaining, held, l.N, now.Sub(c))
			}
			full := !v.Allowed && w.Remaining < need
			switch {
			case full && (w.Reset <= 0 || w.Reset > l.Window+l.Window*(buckets/4+1)/buckets):
				t.Fatalf("step %d, window %d: refused with %d remaining and a retry-after of %v", step, i, w.Remaining, w.Reset)
			case full && v.Group && l.N == v.Limit && l.Unit == v.Unit:
				// The refusing window: the verdict's retry-after, as
				// the feedback's t and the reason string agree.
				retried = w.Reset == v.RetryAfter
			case now.Sub(c) > l.Window/buckets:
				t.Fatalf("step %d, window %d: answered from a reply %v old, more than a bucket", step, i, now.Sub(c))
			}
		}
		if !v.Allowed && v.Group {
			groupRefusals++
			if !retried {
				t.Fatalf("step %d: the group's window %d %v refused with a retry-after of %v, its standing says %+v", step, v.Limit, v.Unit, v.RetryAfter, s)
			}
		}
	}
	run.check(t)
	t.Logf("%d of A's standings answered without a reply at their instant; %d refusals on A, %d by the group; %d admitted in all",
		cached, refusals, groupRefusals, len(run.admitted))
	if cached < 800 || groupRefusals < 20 {
		t.Fatalf("%d standings answered from what A held, %d group refusals: the run did not exercise them", cached, groupRefusals)
	}

	// B fills the group; A's refusal tells when it admits again.
	now = now.Add(2 * time.Second)
	for b.AllowGroupAt("b-0", "", q, run.key, gq, 10, now).Allowed {
	}
	v := a.AllowGroupAt("a-0", "", q, run.key, gq, 10, now)
	if v.Allowed {
		t.Fatal("A admitted into a group B filled")
	}
	a.StandingAt("a-0", "", q, run.key, gq, 10, true, now, &s)
	var w devicelimit.WindowStanding
	for _, l := range ls {
		if l.N == v.Limit && l.Unit == v.Unit {
			w, _ = groupWindowOf(&s, l)
		}
	}
	if !v.Group || w.Remaining >= w.Limit.Units(10) || w.Reset != v.RetryAfter {
		t.Fatalf("refusal's standing of the refusing window %+v, the verdict %+v", w, v)
	}
	if a.AllowGroupAt("a-0", "", q, run.key, gq, 10, now.Add(w.Reset-time.Microsecond)).Allowed {
		t.Fatal("admitted before the retry-after")
	}
	if !a.AllowGroupAt("a-0", "", q, run.key, gq, 10, now.Add(w.Reset)).Allowed {
		t.Fatalf("refused at the retry-after %v the standing told", w.Reset)
	}
}

// groupWindowOf returns the group's window of s of limit l.
func groupWindowOf(s *devicelimit.Standing, l devicelimit.Limit) (devicelimit.WindowStanding, bool) {
	for _, w := range s.Windows[:s.N] {
		if w.Group && w.Limit == l {
			return w, true
		}
	}
	return devicelimit.WindowStanding{}, false
}

// countIn counts the instants of ts in (from, to].
func countIn(ts []devicelimit.Tick, from, to devicelimit.Tick) int {
	n := 0
	for _, x := range ts {
		if x > from && x <= to {
			n++
		}
	}
	return n
}

// TestOwnerGroupStandingRedisAway: with Redis killed, a group's standing
// is still told from what the gateway's last reply said while that
// reply's bucket lasts (its grants are counted in Redis); after it, the
// look fails and the standing falls back to the failure policy's
// (fail-closed here: no group window).
func TestOwnerGroupStandingRedisAway(t *testing.T) {
	srv := redistest.Start(t)
	a := grantOwner(t, srv, 10).o
	q := devicelimit.Quota{Limit: 1000, Window: time.Minute}
	gq := devicelimit.Quota{Limit: 100, Window: time.Minute}
	group := devicelimit.GroupKey("away")
	if !a.AllowGroupAt("d", "", q, group, gq, 10, t0).Allowed {
		t.Fatal("refused")
	}
	var s devicelimit.Standing
	a.StandingAt("d", "", q, group, gq, 10, false, t0, &s)
	before, ok := groupWindow(&s)
	if !ok {
		t.Fatalf("no group window with Redis up: %+v", s)
	}
	srv.Kill()
	a.StandingAt("d", "", q, group, gq, 10, false, t0.Add(time.Second), &s)
	if w, ok := groupWindow(&s); !ok || w.Remaining != before.Remaining || w.Reset != before.Reset-time.Second {
		t.Fatalf("within the reply's bucket, Redis killed: %+v (found %v), want %+v a second on", w, ok, before)
	}
	for i := range 2 {
		a.StandingAt("d", "", q, group, gq, 10, false, t0.Add(7*time.Second), &s)
		if w, ok := groupWindow(&s); ok || s.N != 1 {
			t.Fatalf("standing %d after the bucket, Redis killed: %+v (group window %+v), want the device's window alone", i, s, w)
		}
	}
	if a.shared.Stats().Fallbacks != 0 {
		t.Errorf("a standing counted %d fallbacks", a.shared.Stats().Fallbacks)
	}
}

// TestOwnerGroupStandingAllocs: a standing told from what the gateway
// holds (the device's windows from its table, the group's from its
// grant entry) allocates nothing.
func TestOwnerGroupStandingAllocs(t *testing.T) {
	srv := redistest.Start(t)
	g := grantOwner(t, srv, 10)
	q := devicelimit.Quota{Limit: 1000, Window: time.Minute}
	gq := devicelimit.Quota{Limit: 100, Window: time.Minute}
	group := devicelimit.GroupKey("acme")
	if !g.o.AllowGroupAt("d", "", q, group, gq, 10, t0).Allowed {
		t.Fatal("refused")
	}
	var s devicelimit.Standing
	calls := grantCalls(t, srv)
	if n := testing.AllocsPerRun(1000, func() { g.o.StandingAt("d", "", q, group, gq, 10, false, t0, &s) }); n != 0 {
		t.Fatalf("%v allocations per standing told from the grant entry", n)
	}
	if n := calls(); n != 0 {
		t.Fatalf("%d grant script calls during the measured standings", n)
	}
	if w, ok := groupWindow(&s); !ok || w.Remaining != 100-4+3 {
		t.Fatalf("standing %+v (found %v): want 99 remaining (a grant of 4 counted, 3 of it unused)", w, ok)
	}
}

// TestOwnerGroupStandingCommandsRedisClock is the standing's cost on
// production clocks (Redis's TIME in every script call, spans on the
// monotonic clock): 20,000 messages of 20 devices on two gateways as
// fast as they go, each with its standing asked, in a group far from
// full; Redis's INFO commandstats (GET and TIME run by the scripts
// included) must count at most 0.05 commands per admitted message.
func TestOwnerGroupStandingCommandsRedisClock(t *testing.T) {
	srv := redistest.Start(t)
	gws := [2]*Owner{newOwner(t, srv, 10, 3*time.Second).o, newOwner(t, srv, 10, 3*time.Second).o}
	q := devicelimit.Quota{Limit: devicelimit.MaxLimit, Window: time.Minute}
	group := devicelimit.GroupKey("acme")
	gq := devicelimit.Quota{Limit: devicelimit.MaxLimit, Window: time.Minute}
	var s devicelimit.Standing
	publish := func(n int) int {
		admitted := 0
		for i := range n {
			o, dev := gws[i%2], fmt.Sprint("dev-", i%20)
			now := devicelimit.TickOf(time.Now())
			v := o.AllowGroupAt(dev, "", q, group, gq, 10, now)
			if v.Allowed {
				admitted++
			}
			o.StandingAt(dev, "", q, group, gq, 10, !v.Allowed, now, &s)
			if _, ok := groupWindow(&s); !ok {
				t.Fatalf("no group window in the standing of %s: %+v", dev, s)
			}
		}
		return admitted
	}
	publish(2000) // first claims and checkpoints, grants grown
	before, stats0 := commandCount(t, srv), commandStats(t, srv)
	start := time.Now()
	admitted := publish(20000)
	cmds, stats := commandCount(t, srv)-before, commandStats(t, srv)
	per := float64(cmds) / float64(max(admitted, 1))
	t.Logf("%d commands for %d admitted messages in %v: %.4f per message (evalsha %d, get %d, time %d)", cmds, admitted, time.Since(start).Round(time.Millisecond), per,
		stats["evalsha"]-stats0["evalsha"], stats["get"]-stats0["get"], stats["time"]-stats0["time"])
	if admitted != 20000 {
		t.Fatalf("admitted %d of 20000", admitted)
	}
	if per > 0.05 {
		t.Fatalf("%.4f redis commands per admitted message, want at most 0.05", per)
	}
}

// commandStats returns the calls of each command srv ran, by name, as
// INFO commandstats counts them.
func commandStats(t *testing.T, srv *redistest.Server) map[string]int64 {
	t.Helper()
	info, err := srv.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		m[name], _ = strconv.ParseInt(calls, 10, 64)
	}
	return m
}
