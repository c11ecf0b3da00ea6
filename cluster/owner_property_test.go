package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// ownerRig is a gateway of owner mode in process: an Owner on its own
// clients of srv, and the devices it was told to close.
type ownerRig struct {
	o    *Owner
	mu   sync.Mutex
	lost []string
}

func (g *ownerRig) lostDevices() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.lost...)
}

// newOwner starts an owner on srv (shared windows of buckets buckets,
// failure policy closed) with the gateway TTL ttl.
func newOwner(t testing.TB, srv *redistest.Server, buckets int, ttl time.Duration) *ownerRig {
	t.Helper()
	shared, _ := newLimiter(t, srv, buckets, PolicyFailClosed, time.Second)
	rdb := redis.NewClient(ClientOptions(srv.Addr, time.Second))
	t.Cleanup(func() { rdb.Close() })
	g := &ownerRig{}
	o, err := NewOwner(OwnerOptions{Client: rdb, Shared: shared, GatewayTTL: ttl, FlushInterval: 5 * time.Millisecond,
		OnLost: func(dev string) { g.mu.Lock(); g.lost = append(g.lost, dev); g.mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Close)
	g.o = o
	waitLeased(t, o)
	return g
}

// waitLeased waits until the owner's first liveness renewal landed.
func waitLeased(t testing.TB, o *Owner) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !o.leased() {
		if time.Now().After(deadline) {
			t.Fatal("owner never renewed its liveness")
		}
		time.Sleep(time.Millisecond)
	}
}

// crash kills g as SIGKILL would and deletes its liveness key (as its
// expiry would, later).
func crash(t testing.TB, srv *redistest.Server, g *ownerRig) {
	t.Helper()
	g.o.kill()
	if err := srv.Client().Del(context.Background(), g.o.prefix+"gw:"+g.o.id).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestOwnerMovesAndCrashes is owner mode's property test against a real
// redis-server: devices publish through two in-process gateways, move
// between them at random (the old owner alive: it releases), and at
// random instants the gateway they are on crashes (nothing released:
// the next owner charges the lease) and a new one takes its place. Every
// interval of T must hold at most N admissions per device, whichever
// gateways admitted them; and each device keeps being served.
func TestOwnerMovesAndCrashes(t *testing.T) {
	srv := redistest.Start(t)
	r := rand.New(rand.NewPCG(3, 8))
	const buckets = 10
	gws := [2]*ownerRig{newOwner(t, srv, buckets, time.Second), newOwner(t, srv, buckets, time.Second)}
	quotas := []devicelimit.Quota{
		{Limit: 20, Window: time.Second},
		{Limit: 7, Window: 300 * time.Millisecond},
		{Limit: 3, Window: 2 * time.Second},
	}
	bytesQ := devicelimit.Quota{NWindows: 2, Windows: [devicelimit.MaxWindows]devicelimit.Limit{
		{Unit: devicelimit.Messages, N: 12, Window: time.Second},
		{Unit: devicelimit.Bytes, N: 400, Window: 500 * time.Millisecond},
	}}
	type dev struct {
		name     string
		q        devicelimit.Quota
		on       int
		admitted []devicelimit.Tick
		bytes    []devicelimit.Tick // one entry per byte admitted (sizes are small)
	}
	var devs []*dev
	for i, q := range append(quotas, bytesQ) {
		devs = append(devs, &dev{name: fmt.Sprint("dev-", i), q: q})
	}
	now := t0
	moves, crashes, refused := 0, 0, 0
	for step := range 3000 {
		now = now.Add(time.Duration(r.IntN(30)) * time.Millisecond)
		d := devs[r.IntN(len(devs))]
		switch x := r.IntN(100); {
		case x < 4:
			d.on = 1 - d.on
			moves++
		case x < 6:
			crash(t, srv, gws[d.on])
			gws[d.on] = newOwner(t, srv, buckets, time.Second)
			crashes++
		}
		size := 10 + r.IntN(60)
		v := gws[d.on].o.AllowClassAt(d.name, "", d.q, size, now)
		if !v.Allowed {
			refused++
			continue
		}
		d.admitted = append(d.admitted, now)
		if d.q.NWindows == 2 {
			for range size {
				d.bytes = append(d.bytes, now)
			}
		}
		_ = step
	}
	for _, d := range devs {
		q := d.q
		if q.NWindows == 2 {
			checkWindows(t, d.admitted, devicelimit.Quota{Limit: q.Windows[0].N, Window: q.Windows[0].Window}, d.name+" messages")
			checkWindows(t, d.bytes, devicelimit.Quota{Limit: q.Windows[1].N, Window: q.Windows[1].Window}, d.name+" bytes")
		} else {
			checkWindows(t, d.admitted, q, d.name)
		}
		if len(d.admitted) < 20 {
			t.Errorf("%s: only %d admissions", d.name, len(d.admitted))
		}
	}
	if moves < 20 || crashes < 10 {
		t.Fatalf("only %d moves and %d crashes", moves, crashes)
	}
	t.Logf("%d moves, %d crashes, %d refused; admitted %d %d %d %d", moves, crashes, refused,
		len(devs[0].admitted), len(devs[1].admitted), len(devs[2].admitted), len(devs[3].admitted))
}

// TestOwnerFenced: a checkpoint of an owner whose device another
// gateway claimed meanwhile is refused by the epoch; the stale owner
// drops the device and closes its sessions, refuses what its old
// connection still sends, and decides for it again only after a new
// connection claimed it back.
func TestOwnerFenced(t *testing.T) {
	srv := redistest.Start(t)
	a := newOwner(t, srv, 10, time.Second)
	q := devicelimit.Quota{Limit: 100, Window: time.Minute}
	for i := range 3 {
		if v := a.o.AllowAt("d", q, t0.Add(time.Duration(i)*time.Millisecond)); !v.Allowed {
			t.Fatalf("message %d refused: %+v", i, v)
		}
	}
	// Gateway "other" (not alive: no liveness key) claims the device.
	ctx := context.Background()
	if err := claimScript.Run(ctx, srv.Client(), []string{a.o.recordKey("d")}, "other", a.o.prefix).Err(); err != nil {
		t.Fatal(err)
	}
	sh := a.o.shard("d")
	sh.mu.RLock()
	d := sh.m["d"]
	sh.mu.RUnlock()
	a.o.checkpoint([]*owned{d})
	if a.o.stats.fenced.Load() != 1 {
		t.Fatalf("stale checkpoint not refused: %d fenced", a.o.stats.fenced.Load())
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(a.lostDevices()) == 0 || a.o.Owns("d") {
		if time.Now().After(deadline) {
			t.Fatalf("fenced device not dropped: lost %v, owns %v", a.lostDevices(), a.o.Owns("d"))
		}
		time.Sleep(time.Millisecond)
	}
	if g, _ := srv.Client().HGet(ctx, a.o.recordKey("d"), "g").Result(); g != "other" {
		t.Fatalf("record's owner %q after the stale write, want other", g)
	}
	// Refused while given up: a publish its old connection here sent
	// before it was closed (neither the failure policy's nor a claim).
	if v := a.o.AllowAt("d", q, t0.Add(time.Second)); v.Allowed || a.o.stats.fallbacks.Load() != 0 {
		t.Fatalf("given up, the device was decided: %+v, %d fallbacks", v, a.o.stats.fallbacks.Load())
	}
	// Claimed back by a new connection ("other" is dead): the windows of
	// the checkpoint, with the lease charged.
	if err := a.o.Claim("d"); err != nil {
		t.Fatal(err)
	}
	v := a.o.AllowAt("d", q, t0.Add(time.Second))
	if !v.Allowed || v.Count < 4 {
		t.Fatalf("after the claim back: %+v; want admitted with the earlier 3 and a charge counted", v)
	}
}

// TestOwnerCrashLiveKey: a gateway killed while its liveness key still
// lives: the next claimant asks it, waits out its TTL, and charges its
// lease: at most one lease lost, never more than N admitted.
func TestOwnerCrashLiveKey(t *testing.T) {
	srv := redistest.Start(t)
	a := newOwner(t, srv, 10, 300*time.Millisecond)
	b := newOwner(t, srv, 10, 300*time.Millisecond)
	q := devicelimit.Quota{Limit: 20, Window: time.Hour}
	now := t0
	for i := range 8 {
		if v := a.o.AllowAt("d", q, now); !v.Allowed {
			t.Fatalf("message %d on A refused: %+v", i, v)
		}
	}
	a.o.kill()
	admitted := 8
	for b.o.AllowAt("d", q, now).Allowed {
		admitted++
	}
	if b.o.stats.waits.Load() != 1 || admitted < 10 || admitted > 20 {
		t.Fatalf("admitted %d over both (waits %d, charges %d); want 10..20 after a wait", admitted, b.o.stats.waits.Load(), b.o.stats.charges.Load())
	}
	t.Logf("admitted %d; checkpoints on A %d", admitted, a.o.stats.checkpoints.Load())
}

// TestOwnerRedisRestartedEmpty: Redis restarted empty under an owner
// costs a device that stays nothing: the owner keeps deciding on its
// table (exactly the 2 left of 10), writes the device's record anew at
// its next checkpoint, and a gateway the device moves to afterwards
// gets the exact window.
func TestOwnerRedisRestartedEmpty(t *testing.T) {
	srv := redistest.Start(t)
	a := newOwner(t, srv, 10, time.Second)
	b := newOwner(t, srv, 10, time.Second)
	q := devicelimit.Quota{Limit: 10, Window: time.Hour}
	for i := range 8 {
		if v := a.o.AllowAt("d", q, t0); !v.Allowed {
			t.Fatalf("message %d refused: %+v", i, v)
		}
	}
	srv.Kill()
	srv.Restart() // empty: no persistence
	waitLeased(t, a.o)
	admitted := 0
	deadline := time.Now().Add(10 * time.Second)
	for range 10 {
		v := a.o.AllowAt("d", q, t0)
		for !v.Allowed && v.RetryAfter == time.Second && time.Now().Before(deadline) {
			v = a.o.AllowAt("d", q, t0) // fail-closed while Redis was away
		}
		if v.Allowed {
			admitted++
		}
	}
	if admitted != 2 {
		t.Fatalf("after the restart the owner admitted %d, want the 2 left", admitted)
	}
	// A's liveness key is back at its next renewal (until then a claim
	// takes A for dead and charges its lease: the documented bound).
	for srv.Client().Exists(context.Background(), a.o.prefix+"gw:"+a.o.id).Val() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("A's liveness key not written again")
		}
		time.Sleep(time.Millisecond)
	}
	if v := b.o.AllowAt("d", q, t0); v.Allowed || v.Count != 10 {
		t.Fatalf("moved after the restart: %+v, want refused with 10 counted", v)
	}
}
