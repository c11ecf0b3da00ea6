package cluster

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

func newOverrides(t *testing.T, srv *redistest.Server) (*Overrides, *devicelimit.Resolver) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	return mirror(t, c)
}

// mirror starts overrides shared through c, mirrored in a new resolver,
// and waits for their first full read.
func mirror(t *testing.T, c redis.UniversalClient) (*Overrides, *devicelimit.Resolver) {
	t.Helper()
	res, err := devicelimit.NewResolver(devicelimit.Quota{Limit: 10, Window: time.Second}, nil, 20)
	if err != nil {
		t.Fatal(err)
	}
	o := NewOverrides(c, res, devicelimit.NewManualClock(t0), "", slog.New(slog.NewTextHandler(t.Output(), nil)))
	o.Start()
	t.Cleanup(func() { o.Close() })
	select {
	case <-o.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("overrides not synced within 10s")
	}
	return o, res
}

// waitOverride polls res until device's override is want (nil: none).
func waitOverride(t *testing.T, res *devicelimit.Resolver, device string, want *devicelimit.Override) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, ok := res.Override(device, t0)
		if (want == nil && !ok) || (want != nil && ok && reflect.DeepEqual(got, *want)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("override of %s: got %+v (present %v), want %+v", device, got, ok, want)
		}
		time.Sleep(5 * time.Millisecond) // polling for the notification
	}
}

// TestOverridesShared: two gateways' mirrors of one Redis. A change on
// one reaches the other; a gateway started later reads what is there.
func TestOverridesShared(t *testing.T) {
	srv := redistest.Start(t)
	a, resA := newOverrides(t, srv)
	_, resB := newOverrides(t, srv)
	ov := devicelimit.Override{Quota: devicelimit.Quota{Limit: 3, Window: time.Minute, Policy: devicelimit.PolicyDefer}, ExpiresAt: t0.Add(time.Hour)}
	if err := a.SetOverride("dev-1", ov); err != nil {
		t.Fatal(err)
	}
	waitOverride(t, resA, "dev-1", &ov) // in force at once where it was set
	waitOverride(t, resB, "dev-1", &ov)

	_, resC := newOverrides(t, srv) // started after the change
	waitOverride(t, resC, "dev-1", &ov)

	if had, err := a.DeleteOverride("dev-1"); err != nil || !had {
		t.Fatalf("delete: %v, %v", had, err)
	}
	waitOverride(t, resB, "dev-1", nil)
	waitOverride(t, resC, "dev-1", nil)
	if had, err := a.DeleteOverride("dev-1"); err != nil || had {
		t.Fatalf("second delete: %v, %v; want false", had, err)
	}
}

// TestOverridesBadInputChangesNothing: an invalid quota or device is
// refused with devicelimit's sentinel and nothing reaches Redis.
func TestOverridesBadInputChangesNothing(t *testing.T) {
	srv := redistest.Start(t)
	a, _ := newOverrides(t, srv)
	if err := a.SetOverride("d", devicelimit.Override{Quota: devicelimit.Quota{Limit: 0, Window: time.Second}}); !errors.Is(err, devicelimit.ErrInvalidQuota) {
		t.Fatalf("limit 0: %v", err)
	}
	if err := a.SetOverride("", devicelimit.Override{Quota: devicelimit.Quota{Limit: 1, Window: time.Second}}); !errors.Is(err, devicelimit.ErrInvalidDevice) {
		t.Fatalf("empty device: %v", err)
	}
	if n, err := srv.Client().HLen(context.Background(), a.hash).Result(); err != nil || n != 0 {
		t.Fatalf("hash has %d entries (%v), want 0", n, err)
	}
}

// TestOverridesResyncAfterLostConnection: a gateway whose subscription
// was cut re-reads the hash when it reconnects, so changes it was not
// told of are not lost.
func TestOverridesResyncAfterLostConnection(t *testing.T) {
	srv := redistest.Start(t)
	a, _ := newOverrides(t, srv)
	_, resB := newOverrides(t, srv)
	ov := devicelimit.Override{Quota: devicelimit.Quota{Limit: 5, Window: time.Minute}}
	if err := a.SetOverride("dev-2", ov); err != nil {
		t.Fatal(err)
	}
	waitOverride(t, resB, "dev-2", &ov)
	// Changed behind the gateways' backs, without a notification:
	ctx := context.Background()
	c := srv.Client()
	ov2 := devicelimit.Override{Quota: devicelimit.Quota{Limit: 7, Window: time.Minute}}
	if err := c.HSet(ctx, a.hash, "dev-3", encodeOverride(ov2)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HDel(ctx, a.hash, "dev-2").Err(); err != nil {
		t.Fatal(err)
	}
	lapsed := devicelimit.Override{Quota: ov2.Quota, ExpiresAt: t0.Add(-time.Second)}
	if err := c.HSet(ctx, a.hash, "dev-old", encodeOverride(lapsed)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, ok := resB.Override("dev-3", t0); ok {
		t.Fatal("dev-3 seen without a notification or a resync")
	}
	// Cut the subscribers' connections, as a network failure would.
	if err := c.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	waitOverride(t, resB, "dev-3", &ov2)
	waitOverride(t, resB, "dev-2", nil)
	waitUntil(t, "the lapsed override is removed from the hash", func() bool {
		return c.HExists(ctx, a.hash, "dev-old").Val() == false
	})
}

func FuzzDecodeOverride(f *testing.F) {
	f.Add(encodeOverride(devicelimit.Override{Quota: devicelimit.Quota{Limit: 5, Window: time.Minute, Policy: devicelimit.PolicyDefer}, ExpiresAt: t0}))
	f.Add("v1 1 1 drop 0")
	f.Add("v2 1 2 3 4")
	f.Add(encodeOverride(devicelimit.Override{Quota: devicelimit.WithWindows(devicelimit.PolicyDrop,
		devicelimit.Limit{N: 10, Window: time.Minute}, devicelimit.Limit{Unit: devicelimit.Bytes, N: 5 << 20, Window: 24 * time.Hour}), ExpiresAt: t0}))
	f.Add(encodeOverride(devicelimit.Override{Quota: devicelimit.Quota{Limit: 5, Window: time.Minute},
		Classes: []devicelimit.Class{{Name: "alarms", Topics: []string{"devices/+/alarm/#"}, Quota: devicelimit.Quota{Limit: 1, Window: time.Minute}}}}))
	f.Fuzz(func(t *testing.T, s string) {
		ov, err := decodeOverride(s)
		if err != nil {
			if !errors.Is(err, ErrBadOverride) {
				t.Fatalf("error %v does not wrap ErrBadOverride", err)
			}
			return
		}
		if again, err := decodeOverride(encodeOverride(ov)); err != nil || !reflect.DeepEqual(again, ov) {
			t.Fatalf("round trip of %+v: %+v, %v", ov, again, err)
		}
	})
}

// waitUntil polls cond for up to 5 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling for an asynchronous change
	}
}
