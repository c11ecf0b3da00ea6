package cluster

import (
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// ownerOn starts an owner whose clients reach the Redis behind cfg (a
// single server or a Redis Cluster's seed nodes).
func ownerOn(t *testing.T, cfg Config) *Owner {
	t.Helper()
	decisions, control := NewClients(cfg)
	t.Cleanup(func() { decisions.Close(); control.Close() })
	tab, err := devicelimit.NewTable(20)
	if err != nil {
		t.Fatal(err)
	}
	shared, err := New(Options{Client: decisions, Local: tab, Timeout: cfg.Timeout, Policy: PolicyFailClosed})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(shared.Close)
	o, err := NewOwner(OwnerOptions{Client: decisions, Control: control, Shared: shared, GatewayTTL: time.Second, FlushInterval: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Close)
	waitLeased(t, o)
	return o
}

// TestOwnerGroupsRedisCluster: a tenant group's window is shared by its
// devices on two gateways of owner mode, on a real three-master Redis
// Cluster (which the per-message script could not do: a device's keys
// and its group's live in different slots). 12 devices of 10/h each, on
// both gateways, in a group of 30/h, publish from 12 goroutines at
// once: the group admits exactly 30, each device at most 10; then every
// device moves to the other gateway and the group still admits nothing
// more, and no device more than its 10.
func TestOwnerGroupsRedisCluster(t *testing.T) {
	rc := redistest.StartCluster(t, 3)
	cfg := Config{Addrs: rc.Addrs(), Timeout: time.Second}
	gws := [2]*Owner{ownerOn(t, cfg), ownerOn(t, cfg)}
	if _, ok := gws[0].rdb.(*redis.ClusterClient); !ok {
		t.Fatal("not a cluster client")
	}
	checkGroup(t, gws)
}

// TestOwnerGroupsOneServer is TestOwnerGroupsRedisCluster on one
// redis-server.
func TestOwnerGroupsOneServer(t *testing.T) {
	srv := redistest.Start(t)
	cfg := Config{Addrs: []string{srv.Addr}, Timeout: time.Second}
	checkGroup(t, [2]*Owner{ownerOn(t, cfg), ownerOn(t, cfg)})
}

func checkGroup(t *testing.T, gws [2]*Owner) {
	t.Helper()
	const devices, perDevice, groupN = 12, 10, 30
	q := devicelimit.Quota{Limit: perDevice, Window: time.Hour}
	gq := devicelimit.Quota{Limit: groupN, Window: time.Hour}
	group := devicelimit.GroupKey("acme")
	var mu sync.Mutex
	perDev := map[int]int{}
	byGroup := 0
	round := func(flip int) int {
		admitted := 0
		var wg sync.WaitGroup
		for d := range devices {
			wg.Go(func() {
				g := gws[(d+flip)%2]
				for range 2 * perDevice {
					v := g.AllowGroupAt(fmt.Sprint("dev-", d), "", q, group, gq, 10, t0)
					mu.Lock()
					if v.Allowed {
						perDev[d]++
						admitted++
					} else if v.Group {
						byGroup++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return admitted
	}
	if n := round(0); n != groupN {
		t.Fatalf("group admitted %d, want exactly %d", n, groupN)
	}
	if n := round(1); n != 0 {
		t.Fatalf("after the devices moved, %d more admitted in a full group", n)
	}
	for d, n := range perDev {
		if n > perDevice {
			t.Fatalf("dev-%d admitted %d, quota %d", d, n, perDevice)
		}
	}
	if byGroup == 0 {
		t.Fatal("no refusal named the group")
	}
	for _, g := range gws {
		if n := g.stats.fallbacks.Load(); n != 0 {
			t.Fatalf("%d decisions fell back", n)
		}
	}
}

// TestOwnerMovesRedisCluster: 500 devices decided on A move to B at once
// on a real three-master Redis Cluster: their claims, A's releases and
// the settles go as one pipelined script call per device; every device
// is released (none charged) and its window moves exact.
func TestOwnerMovesRedisCluster(t *testing.T) {
	rc := redistest.StartCluster(t, 3)
	cfg := Config{Addrs: rc.Addrs(), Timeout: time.Second}
	a, b := ownerOn(t, cfg), ownerOn(t, cfg)
	q := devicelimit.Quota{Limit: 4, Window: time.Hour}
	const devices = 500
	for i := range devices {
		for range 3 {
			if !a.AllowAt(fmt.Sprint("dev-", i), q, t0).Allowed {
				t.Fatalf("device %d refused on A", i)
			}
		}
	}
	var wg sync.WaitGroup
	for i := range devices {
		wg.Add(1)
		go func() { defer wg.Done(); b.ClaimSoon(fmt.Sprint("dev-", i)) }()
	}
	wg.Wait()
	for i := range devices {
		dev := fmt.Sprint("dev-", i)
		if !b.AllowAt(dev, q, t0).Allowed {
			t.Fatalf("%s: its 4th message refused on B", dev)
		}
		if b.AllowAt(dev, q, t0).Allowed {
			t.Fatalf("%s: a 5th message admitted on B", dev)
		}
	}
	if r, c := a.stats.releases.Load(), b.stats.charges.Load(); r != devices || c != 0 {
		t.Fatalf("A released %d of %d devices; B charged %d windows (want 0)", r, devices, c)
	}
}
