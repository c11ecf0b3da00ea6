package cluster

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// grantRest returns the unused rest of o's grant on the group's first
// window.
func grantRest(o *Owner, group string) int64 {
	gs := o.grantsOf(group)
	gs.mu.Lock()
	defer gs.mu.Unlock()
	return gs.w[0].left
}

// allowGroup decides one message of dev in group on o, asked again
// while the failure policy (fail-closed) answers: Redis coming back.
func allowGroup(t *testing.T, o *Owner, dev, group string, gq devicelimit.Quota) bool {
	t.Helper()
	q := devicelimit.Quota{Limit: 100000, Window: time.Hour}
	deadline := time.Now().Add(10 * time.Second)
	for {
		v := o.AllowGroupAt(dev, "", q, group, gq, 10, t0)
		if v.Allowed || v.RetryAfter != failRetryAfter {
			return v.Allowed
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the failure policy still decides after 10 s", dev)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestOwnerGroupCutOffFromRedis: a gateway cut off from Redis keeps
// admitting on its grant (counted in Redis) until its fence, then takes
// the failure policy (fail-closed); the gateway still reaching Redis
// gets the rest of the group's N: what both admitted and the cut-off
// one's unused rest are N exactly (never more than N; the rest is all
// the group loses).
func TestOwnerGroupCutOffFromRedis(t *testing.T) {
	srv := redistest.Start(t)
	a, proxy := cutOwner(t, srv, 500*time.Millisecond)
	a.grants.explicit = true
	b := grantOwner(t, srv, 10)
	group := devicelimit.GroupKey("acme")
	gq := devicelimit.Quota{Limit: 400, Window: time.Hour}
	onA := 0
	for range 20 {
		if allowGroup(t, a, "a", group, gq) {
			onA++
		}
	}
	if grantRest(a, group) < 3 {
		t.Fatalf("A's grant has %d left, want at least 3", grantRest(a, group))
	}
	proxy.cutOff()
	for range 2 {
		if !a.AllowGroupAt("a", "", devicelimit.Quota{Limit: 100000, Window: time.Hour}, group, gq, 10, t0).Allowed {
			t.Fatal("A cut off refused a message its grant holds")
		}
		onA++
	}
	for a.leased() {
		time.Sleep(time.Millisecond) // A's fence: its liveness renewals fail
	}
	rest := grantRest(a, group)
	if v := a.AllowGroupAt("a", "", devicelimit.Quota{Limit: 100000, Window: time.Hour}, group, gq, 10, t0); v.Allowed {
		t.Fatalf("A admitted after its fence: %+v", v)
	}
	onB := 0
	for allowGroup(t, b.o, "b", group, gq) {
		onB++
	}
	t.Logf("A admitted %d (its grant's rest %d lost), B %d, of %d", onA, rest, onB, gq.Limit)
	if onA+onB+int(rest) != gq.Limit {
		t.Fatalf("%d admitted over both and %d left on A's grant, want the group's %d exactly", onA+onB, rest, gq.Limit)
	}
}

// TestOwnerGroupRedisRestartedEmpty: Redis restarted empty forgets the
// group's rings; a gateway keeps admitting on its grant until it is used
// up (uncounted by the new rings), and the other gets N afresh: after
// the restart at most N plus the grants outstanding at the restart, the
// documented bound; the rings are written anew.
func TestOwnerGroupRedisRestartedEmpty(t *testing.T) {
	srv := redistest.Start(t)
	a, b := grantOwner(t, srv, 10), grantOwner(t, srv, 10)
	group := devicelimit.GroupKey("acme")
	gq := devicelimit.Quota{Limit: 200, Window: time.Hour}
	for range 20 {
		if !allowGroup(t, a.o, "a", group, gq) {
			t.Fatal("refused before the restart")
		}
	}
	rest := grantRest(a.o, group)
	srv.Kill()
	srv.Restart()
	after := 0
	for range rest {
		if allowGroup(t, a.o, "a", group, gq) {
			after++
		}
	}
	for allowGroup(t, b.o, "b", group, gq) {
		after++
	}
	for allowGroup(t, a.o, "a", group, gq) {
		after++
	}
	t.Logf("after the restart: %d admitted over both (A's grant had %d left at the restart; N %d)", after, rest, gq.Limit)
	if after > gq.Limit+int(rest) {
		t.Fatalf("%d admitted after the restart, more than N %d and A's rest %d", after, gq.Limit, rest)
	}
	if after < gq.Limit {
		t.Fatalf("only %d admitted after the restart: the rings were not written anew", after)
	}
}

// TestOwnerGroupStopGivesBack: a gateway that stops (Close) gives the
// rest of its grant back, so another gateway gets all the group's N the
// stopped one did not use (without the give-back, N less that rest).
func TestOwnerGroupStopGivesBack(t *testing.T) {
	srv := redistest.Start(t)
	a, b := grantOwner(t, srv, 10), grantOwner(t, srv, 10)
	group := devicelimit.GroupKey("acme")
	gq := devicelimit.Quota{Limit: 200, Window: time.Hour}
	const onA = 20
	for range onA {
		if !allowGroup(t, a.o, "a", group, gq) {
			t.Fatal("refused on A")
		}
	}
	rest := grantRest(a.o, group)
	if rest == 0 {
		t.Fatal("A's grant has nothing left to give back")
	}
	a.o.Close()
	onB := 0
	for allowGroup(t, b.o, "b", group, gq) {
		onB++
	}
	t.Logf("A admitted %d and stopped with %d left on its grant; B admitted %d of %d", onA, rest, onB, gq.Limit)
	if onA+onB != gq.Limit {
		t.Fatalf("%d admitted over both, want the group's %d: A's rest %d not given back", onA+onB, gq.Limit, rest)
	}
}

// TestOwnerGroupEarlierBuildLogged: a group also decided per message
// (its w:{\0group} window written, as a gateway of an earlier build in
// owner mode does) is logged as an error naming the group at this
// gateway's first claim on it; a group decided only by grants is not.
func TestOwnerGroupEarlierBuildLogged(t *testing.T) {
	srv := redistest.Start(t)
	shared, _ := newLimiter(t, srv, 10, PolicyFailClosed, time.Second)
	var logs syncBuffer
	rdb := redis.NewClient(ClientOptions(srv.Addr, time.Second))
	t.Cleanup(func() { rdb.Close() })
	o, err := NewOwner(OwnerOptions{Client: rdb, Shared: shared, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Close)
	waitLeased(t, o)
	gq := devicelimit.Quota{Limit: 100, Window: time.Hour}
	if !allowGroup(t, o, "d", devicelimit.GroupKey("clean"), gq) {
		t.Fatal("refused")
	}
	if strings.Contains(logs.String(), "earlier build") {
		t.Fatalf("a group decided only by grants logged: %s", logs.String())
	}
	legacy := devicelimit.GroupKey("acme")
	if v := shared.decideVerdict(legacy, "", gq.Limits(), 0, t0); !v.Allowed {
		t.Fatalf("the per-message script refused: %+v", v)
	}
	if !allowGroup(t, o, "d", legacy, gq) {
		t.Fatal("refused")
	}
	if out := logs.String(); !strings.Contains(out, "earlier build") || !strings.Contains(out, "group=acme") {
		t.Fatalf("the per-message window of group acme not logged: %q", out)
	}
}

// TestOwnerGroupOverrideRaises: a group full on two gateways (both
// refusing locally until the window's retry-after) takes a raised limit
// at once, as an override set through any gateway does: one more on B,
// then none on either.
func TestOwnerGroupOverrideRaises(t *testing.T) {
	srv := redistest.Start(t)
	gws := [2]*ownerRig{grantOwner(t, srv, 10), grantOwner(t, srv, 10)}
	group := devicelimit.GroupKey("acme")
	gq := devicelimit.Quota{Limit: 10, Window: time.Hour}
	admitted := 0
	for i := range 30 {
		if allowGroup(t, gws[i%2].o, fmt.Sprint("dev-", i%2), group, gq) {
			admitted++
		}
	}
	if admitted != 10 {
		t.Fatalf("admitted %d of 10", admitted)
	}
	gq.Limit = 11
	if !allowGroup(t, gws[1].o, "dev-1", group, gq) {
		t.Fatal("the raised limit's one more refused on B")
	}
	for i, g := range gws {
		if allowGroup(t, g.o, fmt.Sprint("dev-", i), group, gq) {
			t.Fatalf("a 12th admitted on gateway %d", i)
		}
	}
}
