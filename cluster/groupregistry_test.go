package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// TestGroupRegistry: groups recorded by one gateway are listed by
// another, with label and quota (several windows, shadow mode) intact;
// the latest record of a group wins; a record this version cannot read
// is left out, not fatal; Close records what was queued.
func TestGroupRegistry(t *testing.T) {
	srv := redistest.Start(t)
	const buckets = 10
	a := NewGroupRegistry(srv.Client(), "t:", buckets, nil)
	b := NewGroupRegistry(srv.Client(), "t:", buckets, nil)
	defer b.Close()
	two := devicelimit.WithWindows(devicelimit.PolicyDrop,
		devicelimit.Limit{Unit: devicelimit.Messages, N: 100, Window: time.Minute},
		devicelimit.Limit{Unit: devicelimit.Bytes, N: 1 << 20, Window: time.Hour})
	two.Shadow = true
	acme := devicelimit.Membership{Name: "acme", Key: devicelimit.GroupKey("acme"), Label: "{tenant}", Quota: two}
	beta := devicelimit.Membership{Name: "beta", Key: devicelimit.GroupKey("beta"), Label: "beta",
		Quota: devicelimit.Quota{Limit: 5, Window: time.Second}}
	a.Record(acme)
	a.Record(beta)
	beta.Quota.Limit = 7 // a later gateway's rule
	a.Record(beta)
	a.Close()
	a.Record(beta) // after Close: ignored, no panic
	ctx := context.Background()
	if err := srv.Client().HSet(ctx, "t:groups", "broken", "{not json").Err(); err != nil {
		t.Fatal(err)
	}
	got, err := b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != acme || got[1].Name != "beta" || got[1].Quota.Limit != 7 {
		t.Fatalf("listed %+v\nwant acme %+v and beta at 7", got, acme)
	}
}
