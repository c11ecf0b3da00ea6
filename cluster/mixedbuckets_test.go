package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// TestMixedBucketCountsShareAWindow: gateways whose limits.buckets
// differ (a rolling change of it) decide on the same device window
// alternately. The window keeps the bucket count it was made with until
// it expires, so the device gets its quota. (Re-cutting it at every
// change of bucket count moved all its counts into the newest bucket
// each time: they never expired, and a device sending at its quota's
// rate through both got 5 messages in 10 s, then none.)
func TestMixedBucketCountsShareAWindow(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	a, _ := newLimiter(t, srv, 10, PolicyFailClosed, time.Second)
	b, _ := newLimiter(t, srv, 20, PolicyFailClosed, time.Second)
	q := devicelimit.Quota{Limit: 5, Window: time.Second}
	now := int64(t0) / 1000
	var admitted []devicelimit.Tick
	for i := range 100 { // 10 per second for 10 s, alternately through a and b
		l := []*Limiter{a, b}[i%2]
		d, err := l.evalAt(ctx, "alt", q, true, now)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted = append(admitted, devicelimit.Tick(now*1000))
		}
		now += 100_000
	}
	checkWindows(t, admitted, q, "alternating bucket counts")
	// At 10/s against 5/s: about 5 admitted per second (fewer by about
	// 1/B where the counted span exceeds T), 45 at least.
	if len(admitted) < 45 {
		t.Fatalf("%d of 100 admitted over 10 s at a quota of %v, want about 50", len(admitted), q)
	}
	// A window made afresh takes the bucket count of its first decider.
	if err := srv.Client().Del(ctx, a.windowKey("alt")).Err(); err != nil {
		t.Fatal(err)
	}
	if d, _ := b.evalAt(ctx, "alt", q, true, now); !d.Allowed {
		t.Fatalf("fresh window: %+v", d)
	}
	if n, err := srv.Client().StrLen(ctx, a.windowKey("alt")).Result(); err != nil || n != 43+21 {
		t.Fatalf("fresh window by b: %d bytes (%v), want %d (20 buckets)", n, err, 43+21)
	}
}
