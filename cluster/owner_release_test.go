package cluster

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// waitFor polls cond until it holds, failing the test after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestOwnerLapseVoidsLeases: gateway A's liveness renewals fail for
// longer than its TTL (its control connection refused by Redis, its
// decision connection fine); its key expires, and B claims A's device
// without asking A (A is taken for dead). When A's renewals come back,
// A must not admit on the lease it held: every device passes a
// checkpoint first, which Redis refuses (B's epoch), and A drops it.
// Before, A admitted on its old lease until its next checkpoint, B
// owning the device.
func TestOwnerLapseVoidsLeases(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := srv.Client()
	if err := admin.Do(ctx, "ACL", "SETUSER", "ctl", "on", ">pw", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	shared, _ := newLimiter(t, srv, 10, PolicyFailClosed, time.Second)
	rdb := redis.NewClient(ClientOptions(srv.Addr, time.Second))
	ctl := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "ctl", Password: "pw", MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { rdb.Close(); ctl.Close() })
	a, err := NewOwner(OwnerOptions{Client: rdb, Control: ctl, Shared: shared, GatewayTTL: 500 * time.Millisecond, FlushInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	waitLeased(t, a)
	q := devicelimit.Quota{Limit: 10, Window: time.Minute}
	now := t0
	for i := range 2 {
		if !a.AllowAt("d", q, now).Allowed {
			t.Fatalf("message %d on A refused", i)
		}
	}
	// A's control connection cut: no renewal lands; its key expires.
	if err := admin.Do(ctx, "ACL", "SETUSER", "ctl", "off").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "CLIENT", "KILL", "USER", "ctl").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "A's liveness key to expire", func() bool {
		n, err := admin.Exists(ctx, a.prefix+"gw:"+a.id).Result()
		return err == nil && n == 0 && !a.leased()
	})
	b := newOwner(t, srv, 10, 500*time.Millisecond)
	if err := b.o.Claim("d"); err != nil {
		t.Fatal(err)
	}
	if !b.o.AllowAt("d", q, now).Allowed {
		t.Fatal("message on B refused")
	}
	// A's renewals land again.
	if err := admin.Do(ctx, "ACL", "SETUSER", "ctl", "on").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "A's renewals to land again", a.leased)
	// A may admit only once it has the device back (its decision claims
	// it again once the refused checkpoint dropped it: B releases it
	// first); never while B still owns it.
	if d := a.AllowAt("d", q, now); d.Allowed && b.o.Owns("d") {
		t.Fatal("A admitted on the lease it held before the lapse, while B owns the device")
	}
}

// TestOwnerCloseRedisFrozen: Close with a Redis that does not answer
// (SIGSTOP) and many devices to release returns within closeTimeout and
// a margin: one batch waits, the rest are left to their crash charge.
// Before, Close released one device at a time within 5 s in all: the
// whole of a gateway's shutdown deadline.
func TestOwnerCloseRedisFrozen(t *testing.T) {
	srv := redistest.Start(t)
	g := newOwner(t, srv, 10, time.Second)
	q := devicelimit.Quota{Limit: 10, Window: time.Minute}
	for i := range 500 {
		if !g.o.AllowAt(fmt.Sprint("dev-", i), q, t0).Allowed {
			t.Fatalf("device %d refused", i)
		}
	}
	srv.Stop()
	t.Cleanup(srv.Cont)
	start := time.Now()
	g.o.Close()
	if d := time.Since(start); d > closeTimeout+1500*time.Millisecond {
		t.Fatalf("Close took %s with Redis frozen, want at most %s", d, closeTimeout+1500*time.Millisecond)
	}
}

// TestOwnerManyMovesReleased: 2,000 devices move from A to B at once
// (B claims them all). A reads the requests at its renewals and
// releases every one (written in batches, none dropped while the
// releaser is busy), so B charges none: each move is exact. Before, a
// renewal that found the releaser busy dropped the requests and the
// releaser wrote one device at a time, so claims waited out A's TTL and
// charged the lease.
//
// A claim waits for the release at most A's TTL and a tenth, then
// charges (docs/design.md): at a TTL of 500 ms, on a loaded machine
// under the race detector, 145 of the 2,000 releases landed after that,
// correctly charged and not what this test is about. The default TTL
// leaves the releases the time the design gives them.
func TestOwnerManyMovesReleased(t *testing.T) {
	srv := redistest.Start(t)
	a := newOwner(t, srv, 10, DefaultGatewayTTL)
	b := newOwner(t, srv, 10, DefaultGatewayTTL)
	q := devicelimit.Quota{Limit: 10, Window: time.Minute}
	const devices = 2000
	for i := range devices {
		if !a.o.AllowAt(fmt.Sprint("dev-", i), q, t0).Allowed {
			t.Fatalf("device %d refused on A", i)
		}
	}
	errs := make(chan error, devices)
	for i := range devices {
		go func() { errs <- b.o.Claim(fmt.Sprint("dev-", i)) }()
	}
	for range devices {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if r, c := a.o.stats.releases.Load(), b.o.stats.charges.Load(); r != devices || c != 0 {
		t.Fatalf("A released %d of %d devices; B charged %d windows (want 0)", r, devices, c)
	}
}

// TestOwnerCrashAfterIdleChargesLeaseOnly: A admits a device's whole
// window and crashes; the device comes back to B an hour later. A's
// checkpoint has long expired: B charges only A's lease (2 of 5) and
// admits 3. Before, charged() moved the expired counts into the ring's
// oldest bucket, and B refused the device for about T/B.
func TestOwnerCrashAfterIdleChargesLeaseOnly(t *testing.T) {
	srv := redistest.Start(t)
	a := newOwner(t, srv, 10, time.Second)
	q := devicelimit.Quota{Limit: 5, Window: 10 * time.Second}
	for i := range 5 {
		if !a.o.AllowAt("d", q, t0).Allowed {
			t.Fatalf("message %d on A refused", i)
		}
	}
	crash(t, srv, a)
	b := newOwner(t, srv, 10, time.Second)
	later := t0.Add(time.Hour)
	for i := range 3 {
		if !b.o.AllowAt("d", q, later).Allowed {
			t.Fatalf("message %d on B an hour later refused: expired counts charged", i)
		}
	}
	if b.o.AllowAt("d", q, later).Allowed {
		t.Fatal("a 4th message admitted on B: A's lease of 2 not charged")
	}
}

// TestOwnerRedisEmptyVoidsLeases: Redis restarts empty while A owns a
// device that sends little (no checkpoint due); B claims it as new (its
// record is gone). A's next renewal finds its liveness key gone before
// its TTL and voids its leases: A does not admit while B owns the
// device. Before, A admitted on its lease with B owning the device.
func TestOwnerRedisEmptyVoidsLeases(t *testing.T) {
	srv := redistest.Start(t)
	a := newOwner(t, srv, 10, 2*time.Second)
	b := newOwner(t, srv, 10, 2*time.Second)
	q := devicelimit.Quota{Limit: 5, Window: time.Hour}
	if !a.o.AllowAt("d", q, t0).Allowed {
		t.Fatal("first message on A refused")
	}
	srv.Kill()
	srv.Restart() // empty: no persistence
	if err := b.o.Claim("d"); err != nil {
		t.Fatal(err)
	}
	// Both liveness keys back (until B's is, a claim of A's would take B
	// for dead: the documented bound after Redis lost its data).
	waitFor(t, "A's and B's liveness keys written again", func() bool {
		return srv.Client().Exists(context.Background(), a.o.prefix+"gw:"+a.o.id, b.o.prefix+"gw:"+b.o.id).Val() == 2 && a.o.leased()
	})
	if v := a.o.AllowAt("d", q, t0); v.Allowed && b.o.Owns("d") {
		t.Fatalf("A admitted on its lease from before Redis lost its data, while B owns the device (A: gen %d, checkpoints %d, fenced %d, claims %d; B: claims %d, waits %d, releases %d; record %v)",
			a.o.gen.Load(), a.o.stats.checkpoints.Load(), a.o.stats.fenced.Load(), a.o.stats.claims.Load(),
			b.o.stats.claims.Load(), b.o.stats.waits.Load(), b.o.stats.releases.Load(),
			srv.Client().HMGet(context.Background(), a.o.recordKey("d"), "g", "e", "w").Val())
	}
}

// TestOwnerLongerWindowThenCrash: a device's window grows from 1 s to an
// hour (an override) just after its lease's count let go of admissions
// its table still holds (the count spans 1 s and a sixteenth, the table
// 1 s and a tenth at 10 buckets); A then crashes and B takes the device.
// Every admission lies within the hour: at most N in all, as on one
// gateway. Before, A went on on its lease from a checkpoint that did not
// hold those admissions, and B, charging one lease on that checkpoint,
// admitted 5 more: 13 of 10.
func TestOwnerLongerWindowThenCrash(t *testing.T) {
	srv := redistest.Start(t)
	a := newOwner(t, srv, 10, time.Second)
	short := devicelimit.Quota{Limit: 10, Window: time.Second}
	long := devicelimit.Quota{Limit: 10, Window: time.Hour}
	admitted := 0
	allow := func(g *ownerRig, q devicelimit.Quota, at time.Duration, n int) {
		for range n {
			if g.o.AllowAt("d", q, t0.Add(at)).Allowed {
				admitted++
			}
		}
	}
	allow(a, short, 0, 4) // the first checkpoint holds none of them
	allow(a, short, 1080*time.Millisecond, 1)
	allow(a, long, 1090*time.Millisecond, 3)
	crash(t, srv, a)
	b := newOwner(t, srv, 10, time.Second)
	allow(b, long, 2*time.Second, 20)
	if admitted > long.Limit {
		t.Fatalf("%d admitted within an hour through A and B, want at most %d", admitted, long.Limit)
	}
}

// TestOwnerRestsWhileRedisDown: with Redis frozen (SIGSTOP), the first
// claim waits its timeout and fails; then, while Redis rests
// (RetryInterval), the claims of 300 more devices fail at once and their
// decisions take the failure policy without waiting. Before, each
// decision of a device not yet owned tried a claim of its own: 300
// took 3 s (three waited the timeout of 1 s before the Redis client's
// pool began failing its dials at once; a Redis that answers late, not
// at all, costs the timeout each).
func TestOwnerRestsWhileRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	tab, err := devicelimit.NewTable(10)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(ClientOptions(srv.Addr, time.Second))
	t.Cleanup(func() { rdb.Close() })
	shared, err := New(Options{Client: rdb, Local: tab, Timeout: time.Second, Policy: PolicyFailClosed, RetryInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(shared.Close)
	o := frozenOwner(t, srv, OwnerOptions{Client: rdb, Shared: shared, GatewayTTL: 4 * time.Second})
	q := devicelimit.Quota{Limit: 10, Window: time.Minute}
	if o.AllowAt("first", q, t0).Allowed {
		t.Fatal("admitted with Redis frozen and the failure policy closed")
	}
	start := time.Now()
	for i := range 300 {
		if o.AllowAt(fmt.Sprint("dev-", i), q, t0).Allowed {
			t.Fatalf("device %d admitted with Redis frozen and the failure policy closed", i)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("300 decisions took %s with Redis resting after a failure, want them at once", d)
	}
}

// TestOwnerConnectStormBatched: 5,000 devices connect at once (a claim
// each, as the broker's connection hook makes them): every claim
// succeeds, in a few script calls of many devices. Before, each claim
// was a script call of its own, 5,000 callers for a pool of 20
// connections: under a loaded gateway they timed out into the failure
// policy, and each timed-out connection was dialled again (HELLO).
func TestOwnerConnectStormBatched(t *testing.T) {
	srv := redistest.Start(t)
	g := newOwner(t, srv, 10, time.Second)
	ctx := context.Background()
	if err := srv.Client().ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const devices = 5000
	errs := make(chan error, devices)
	for i := range devices {
		go func() { errs <- g.o.Claim(fmt.Sprint("dev-", i)) }()
	}
	for range devices {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	info := srv.Client().Info(ctx, "commandstats").Val()
	var calls int
	if _, rest, ok := strings.Cut(info, "cmdstat_evalsha:calls="); ok {
		calls, _ = strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
	}
	if calls == 0 || calls > devices/100 {
		t.Fatalf("%d script calls for %d claims, want at most %d", calls, devices, devices/100)
	}
	t.Logf("%d claims in %d script calls", devices, calls)
}
