package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// TestRedisCluster runs the limiter and the shared overrides on a real
// three-master Redis Cluster: windows of devices spread over the slots
// admit exactly N each, and an override set through one gateway's
// client reaches another's.
func TestRedisCluster(t *testing.T) {
	rc := redistest.StartCluster(t, 3)
	cfg := Config{Addrs: rc.Addrs(), Timeout: time.Second}
	decisions, control := NewClients(cfg)
	t.Cleanup(func() { decisions.Close(); control.Close() })
	tab, err := devicelimit.NewTable(20)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(Options{Client: decisions, Local: tab, Timeout: time.Second, Policy: PolicyFailClosed, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	if l.multi {
		t.Fatal("a cluster client must send one call per decision")
	}
	const devices, limit = 60, 5
	q := devicelimit.Quota{Limit: limit, Window: time.Hour}
	// A burst from 16 goroutines over devices spread on every node;
	// each device admits exactly its limit.
	burst := func(prefix string) {
		t.Helper()
		var mu sync.Mutex
		allowed := map[string]int{}
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Go(func() {
				for i := range devices * 2 {
					dev := fmt.Sprint(prefix, (i+g)%devices)
					if l.AllowAt(dev, q, 0).Allowed {
						mu.Lock()
						allowed[dev]++
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		for i := range devices {
			if n := allowed[fmt.Sprint(prefix, i)]; n != limit {
				t.Fatalf("%s%d: %d admitted, want %d", prefix, i, n, limit)
			}
		}
		if st := l.Stats(); st.Fallbacks != 0 {
			t.Fatalf("%d decisions fell back: %+v", st.Fallbacks, st)
		}
	}
	burst("dev-")
	// One node forgets the script (as after a restart): the calls it
	// answers NOSCRIPT are sent again with the script, the others are
	// not disturbed.
	if err := rc.Nodes[1].Client().ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	burst("after-flush-")

	newMirror := func() (*Overrides, *devicelimit.Resolver) {
		_, c := NewClients(cfg)
		t.Cleanup(func() { c.Close() })
		return mirror(t, c)
	}
	a, _ := newMirror()
	_, resB := newMirror()
	ov := devicelimit.Override{Quota: devicelimit.Quota{Limit: 2, Window: time.Minute}}
	if err := a.SetOverride("dev-7", ov); err != nil {
		t.Fatal(err)
	}
	waitOverride(t, resB, "dev-7", &ov)
	if had, err := a.DeleteOverride("dev-7"); err != nil || !had {
		t.Fatalf("delete: %v, %v", had, err)
	}
	waitOverride(t, resB, "dev-7", nil)
}
