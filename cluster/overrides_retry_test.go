package cluster

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// TestOverridesSyncErrorBacksOff: when the full read of the overrides
// fails while Redis answers (here the hash's key holds a string; an ACL
// without HGETALL does the same), the gateway retries with a growing
// pause and logs at most one line every 10 s, instead of re-reading as
// fast as Redis answers and logging every attempt. Once the key is
// right the overrides are read.
func TestOverridesSyncErrorBacksOff(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	c := srv.Client()
	if err := c.Set(ctx, DefaultPrefix+"overrides", "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := devicelimit.NewResolver(devicelimit.Quota{Limit: 10, Window: time.Second}, nil, 20)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	o := NewOverrides(rdb, res, devicelimit.NewManualClock(t0), "", slog.New(slog.NewTextHandler(&logs, nil)))
	begin := time.Now()
	o.Start()
	t.Cleanup(func() { o.Close() })
	waitUntil(t, "4 attempts at reading the overrides", func() bool { return hgetallCalls(t, c) >= 4 })
	took := time.Since(begin)
	if took < 300*time.Millisecond { // pauses of 50, 100 and 200 ms at least
		t.Errorf("4 failed reads within %v: want pauses between them", took)
	}
	if n := strings.Count(logs.String(), "quota overrides not read"); n != 1 {
		t.Errorf("%d log lines for the failed reads, want 1:\n%s", n, logs.String())
	}
	ov := devicelimit.Override{Quota: devicelimit.Quota{Limit: 4, Window: time.Minute}}
	if _, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, DefaultPrefix+"overrides")
		p.HSet(ctx, DefaultPrefix+"overrides", "dev-1", encodeOverride(ov))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-o.Synced():
	case <-time.After(5 * time.Second):
		t.Fatal("overrides not read within 5s of the key being fixed")
	}
	waitOverride(t, res, "dev-1", &ov)
}

// hgetallCalls returns how many HGETALL commands the server ran.
func hgetallCalls(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_hgetall:calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

// TestOverridesChangeReadFailureResyncs: a notification whose device
// cannot be read at once (here an ACL that denies HGET; in production a
// timeout or a connection lost at that moment) is not lost: the gateway
// reads all the overrides again.
func TestOverridesChangeReadFailureResyncs(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := srv.Client()
	if err := admin.Do(ctx, "ACL", "SETUSER", "gw", "on", ">pw", "~*", "&*", "+@all", "-hget").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "gw", Password: "pw"})
	t.Cleanup(func() { c.Close() })
	a, _ := newOverrides(t, srv)
	_, resB := mirror(t, c)
	ov := devicelimit.Override{Quota: devicelimit.Quota{Limit: 6, Window: time.Minute}}
	if err := a.SetOverride("dev-1", ov); err != nil {
		t.Fatal(err)
	}
	waitOverride(t, resB, "dev-1", &ov)
	if _, err := a.DeleteOverride("dev-1"); err != nil {
		t.Fatal(err)
	}
	waitOverride(t, resB, "dev-1", nil)
}

// TestOverridesOwnChangeDoesNotOutliveALaterOne: gateway A stores an
// override; before A puts it in force locally, gateway B deletes it and
// A applies B's notification. A must end with Redis's state (none), not
// with its own older change.
func TestOverridesOwnChangeDoesNotOutliveALaterOne(t *testing.T) {
	srv := redistest.Start(t)
	a, resA := newOverrides(t, srv)
	b, _ := newOverrides(t, srv)
	old := devicelimit.Override{Quota: devicelimit.Quota{Limit: 2, Window: time.Minute}}
	if err := a.SetOverride("dev-1", old); err != nil {
		t.Fatal(err)
	}
	waitOverride(t, resA, "dev-1", &old)
	a.stored = func(device string) {
		a.stored = nil
		if _, err := b.DeleteOverride(device); err != nil {
			t.Error(err)
		}
		waitOverride(t, resA, device, nil) // A has applied B's change
	}
	if err := a.SetOverride("dev-1", devicelimit.Override{Quota: devicelimit.Quota{Limit: 9, Window: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	if got, ok := resA.Override("dev-1", t0); ok {
		t.Fatalf("A holds %+v after B's later delete; Redis holds none", got)
	}
}
