package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// TestOwnerGroupIdleGrantsDropped: a templated group (one per device)
// leaves a grant entry per device a gateway saw; once a grant's span
// has ended and no decision used it for grantIdle (the injected clock
// advanced), the sweep drops the entry and gives its rest back, which
// Redis's rings show; a group dropped is decided again (a new entry, a
// new claim).
func TestOwnerGroupIdleGrantsDropped(t *testing.T) {
	idleGrants(t, grantOwner(t, redistest.Start(t), 10).o)
}

// TestOwnerGroupIdleGrantsRedisCluster is TestOwnerGroupIdleGrantsDropped
// on a real three-master Redis Cluster: the give-backs go one call per
// group, pipelined (the groups' rings are in slots of their own).
func TestOwnerGroupIdleGrantsRedisCluster(t *testing.T) {
	rc := redistest.StartCluster(t, 3)
	o := ownerOn(t, Config{Addrs: rc.Addrs(), Timeout: time.Second})
	o.grants.explicit = true
	idleGrants(t, o)
}

// idleGrants runs the idle grant test on o (grants on the injected
// clock).
func idleGrants(t *testing.T, o *Owner) {
	q := devicelimit.Quota{Limit: 100000, Window: time.Hour}
	gq := devicelimit.Quota{Limit: 100, Window: 10 * time.Minute} // spans of 3 min at most (F+1 buckets)
	const groups = 200
	key := func(i int) string { return devicelimit.GroupKey(fmt.Sprint("client-", i)) }
	for i := range groups {
		if !o.AllowGroupAt(fmt.Sprint("dev-", i), "", q, key(i), gq, 10, t0).Allowed {
			t.Fatalf("group %d refused its first message", i)
		}
	}
	held := func(i int) int {
		var s devicelimit.Standing
		o.groupStanding(key(i), gq, 0, false, t0.Add(4*time.Minute), &s)
		return gq.Limit - s.Windows[0].Remaining
	}
	st := o.Stats()
	if st.Grants != groups || held(0) != grantFirst {
		t.Fatalf("%d grant entries, group 0's ring holds %d: want %d and a first grant of %d", st.Grants, held(0), groups, grantFirst)
	}
	// Four minutes later: the spans have ended, the entries are idle.
	// The sweeper runs at the latest decision's instant.
	pacer := devicelimit.GroupKey("pacer")
	if !o.AllowGroupAt("dev-pacer", "", q, pacer, gq, 10, t0.Add(4*time.Minute)).Allowed {
		t.Fatal("pacer refused")
	}
	signal(o.sweepNow)
	back := uint64(groups * (grantFirst - 1)) // each group's first grant less its message
	deadline := time.Now().Add(10 * time.Second)
	for st := o.Stats(); st.Grants != 1 || st.GrantReturned[devicelimit.Messages] != back; st = o.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("%d grant entries and %d units given back 10 s after the sweep was nudged, want 1 (the pacer's) and %d",
				st.Grants, st.GrantReturned[devicelimit.Messages], back)
		}
		time.Sleep(time.Millisecond)
	}
	for i := range groups {
		if n := held(i); n != 1 {
			t.Fatalf("group %d's ring holds %d after the sweep, want its 1 admitted", i, n)
		}
	}
	// The pacer's grant too, once its span has ended and it idled.
	if n := o.dropIdleGrants(context.Background(), o.grantNow(t0.Add(8*time.Minute)), int64(grantIdle)); n != 1 || o.Stats().Grants != 0 {
		t.Fatalf("dropped %d, %d entries left; want the pacer's dropped, none left", n, o.Stats().Grants)
	}
	if r := o.Stats().GrantReturned[devicelimit.Messages]; r != back+grantFirst-1 {
		t.Errorf("%d units given back after the pacer's drop, want %d", r, back+grantFirst-1)
	}
	// A dropped group is decided again: a new entry and claim.
	claims := o.Stats().GrantClaims
	if !o.AllowGroupAt("dev-0", "", q, key(0), gq, 10, t0.Add(8*time.Minute)).Allowed {
		t.Fatal("group 0 refused after its entry was dropped")
	}
	if st := o.Stats(); st.Grants != 1 || st.GrantClaims != claims+1 {
		t.Fatalf("%d entries and %d new claims after deciding a dropped group, want 1 and 1", st.Grants, st.GrantClaims-claims)
	}
}

// TestOwnerGroupGiveBackBadKey: a give-back Redis does not take (the
// group's ring key holds something else: the script writes nothing) is
// not counted as given back; the entry is dropped all the same.
func TestOwnerGroupGiveBackBadKey(t *testing.T) {
	srv := redistest.Start(t)
	o := grantOwner(t, srv, 10).o
	q := devicelimit.Quota{Limit: 100000, Window: time.Hour}
	gq := devicelimit.Quota{Limit: 100, Window: 10 * time.Minute}
	group := devicelimit.GroupKey("acme")
	if !o.AllowGroupAt("d", "", q, group, gq, 10, t0).Allowed {
		t.Fatal("refused")
	}
	gs := o.grantsOf(group)
	gs.mu.Lock()
	key := gs.keys[0]
	gs.mu.Unlock()
	if err := srv.Client().Set(context.Background(), key, "not a ring", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n := o.dropIdleGrants(context.Background(), o.grantNow(t0.Add(4*time.Minute)), int64(grantIdle)); n != 1 {
		t.Fatalf("dropped %d entries, want 1", n)
	}
	if st := o.Stats(); st.Grants != 0 || st.GrantReturned[devicelimit.Messages] != 0 {
		t.Fatalf("%d entries left and %d units counted as given back, want 0 and 0 (Redis refused the give-back)", st.Grants, st.GrantReturned[devicelimit.Messages])
	}
	if v, _ := srv.Client().Get(context.Background(), key).Result(); v != "not a ring" {
		t.Fatalf("the key holds %q after the give-back, want it untouched", v)
	}
}
