package fleet

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/freeport"
	"github.com/devicegate/devicegate/internal/mqtttest"
	"github.com/devicegate/devicegate/internal/poll"
)

// docHAProxy returns docs/operations.md's two HAProxy configurations:
// by connection, then by client ID.
func docHAProxy(t *testing.T) (byConn, byID string) {
	t.Helper()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := DocHAProxyConfigs(string(b))
	if len(blocks) != 2 || !strings.Contains(blocks[0], "balance by connection") || !strings.Contains(blocks[1], "route by client ID") {
		t.Fatalf("docs/operations.md: want the two ```haproxy blocks, by connection then by client ID; got %d:\n%s", len(blocks), strings.Join(blocks, "\n---\n"))
	}
	return blocks[0], blocks[1]
}

// startGateways starts n gateways for the test, stopped at its end.
func startGateways(t *testing.T, n int, spec GatewaySpec) *Gateways {
	t.Helper()
	spec.Bin = gatewayBin
	if spec.Quota.Limit == 0 {
		spec.Quota = devicelimit.Quota{Limit: 100, Window: 10 * time.Second}
	}
	g, err := StartGateways(t.TempDir(), n, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Errorf("stop the gateways: %v", err)
		}
	})
	return g
}

// startHAProxy runs the documented configuration doc in front of gws.
func startHAProxy(t *testing.T, doc string, gws *Gateways) *HAProxy {
	t.Helper()
	listen, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := HAProxyConfig(doc, listen, gws.Addrs)
	if err != nil {
		t.Fatal(err)
	}
	hp, err := StartHAProxy(t.TempDir(), listen, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hp.Kill)
	return hp
}

// where returns the gateway device id is connected to, or -1.
func where(t *testing.T, gws *Gateways, id string) int {
	t.Helper()
	for i := range gws.Len() {
		if !gws.Alive(i) {
			continue
		}
		ok, err := gws.Connected(context.Background(), i, id)
		if err != nil {
			t.Fatalf("gateway %d: device %s: %v", i, id, err)
		}
		if ok {
			return i
		}
	}
	return -1
}

// TestHAProxyConfigs runs docs/operations.md's two HAProxy
// configurations, as written, in front of three gateways. By
// connection, held connections are spread over all three. By client
// ID, a device reconnecting reaches the gateway it was on; when that
// gateway is killed, its devices reach another, and the others stay.
func TestHAProxyConfigs(t *testing.T) {
	byConn, byID := docHAProxy(t)
	gws := startGateways(t, 3, GatewaySpec{})

	t.Run("by connection", func(t *testing.T) {
		hp := startHAProxy(t, byConn, gws)
		seen := map[int]int{}
		for i := range 6 {
			id := "conn-" + string(rune('a'+i))
			c := mqtttest.Dial5(t, hp.Addr, id)
			defer c.Close()
			var at int
			poll.Until(t, 10*time.Second, id+" seen connected by a gateway", func() bool { at = where(t, gws, id); return at >= 0 })
			seen[at]++
		}
		if len(seen) != 3 {
			t.Fatalf("6 held connections by gateway %v: want all three gateways used", seen)
		}
	})

	t.Run("by client ID", func(t *testing.T) {
		hp := startHAProxy(t, byID, gws)
		first := map[string]int{}
		used := map[int]bool{}
		ids := []string{"dev-a", "dev-b", "dev-c", "dev-d", "dev-e", "dev-f", "dev-g", "dev-h"}
		connectAt := func(id string) int {
			c := mqtttest.Dial5(t, hp.Addr, id)
			defer c.Close()
			var at int
			poll.Until(t, 10*time.Second, id+" seen connected by a gateway", func() bool { at = where(t, gws, id); return at >= 0 })
			return at
		}
		for _, id := range ids {
			first[id] = connectAt(id)
			used[first[id]] = true
		}
		if len(used) < 2 {
			t.Fatalf("8 client IDs all on one gateway: %v", first)
		}
		for _, id := range ids {
			if at := connectAt(id); at != first[id] {
				t.Fatalf("%s reconnected to gateway %d, was on %d: not routed by client ID", id, at, first[id])
			}
		}
		killed := first["dev-a"]
		if err := gws.Kill(killed); err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			at := -1
			poll.Until(t, 20*time.Second, id+" connected again after its gateway was killed", func() bool {
				c, err := mqtttest.TryDial5(hp.Addr, id)
				if err != nil {
					return false
				}
				defer c.Close()
				poll.Until(t, 10*time.Second, id+" seen connected", func() bool { at = where(t, gws, id); return at >= 0 })
				return true
			})
			switch {
			case first[id] == killed && at == killed:
				t.Fatalf("%s still on the killed gateway %d", id, killed)
			case first[id] != killed && at != first[id]:
				t.Fatalf("%s moved from gateway %d to %d though only gateway %d went away", id, first[id], at, killed)
			}
		}
	})
}

// TestHAProxyConfigMoreGateways: the documented three server lines
// grow to one per gateway; a bind line missing, or more server lines
// than gateways, is refused.
func TestHAProxyConfigMoreGateways(t *testing.T) {
	doc := "frontend f\n    bind 127.0.0.1:1883\nbackend b\n    server gw1 127.0.0.1:18831 check\n    server gw2 127.0.0.1:18832 check\n"
	got, err := HAProxyConfig(doc, "127.0.0.1:7000", []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"})
	want := "frontend f\n    bind 127.0.0.1:7000\nbackend b\n    server gw1 127.0.0.1:1 check\n    server gw2 127.0.0.1:2 check\n    server gw3 127.0.0.1:3 check\n    server gw4 127.0.0.1:4 check\n"
	if err != nil || got != want {
		t.Fatalf("got %q, %v\nwant %q", got, err, want)
	}
	if _, err := HAProxyConfig(doc, "127.0.0.1:7000", []string{"127.0.0.1:1"}); err == nil {
		t.Fatal("two server lines for one gateway accepted")
	}
	if _, err := HAProxyConfig("backend b\n    server gw1 127.0.0.1:1 check\n", "127.0.0.1:7000", []string{"127.0.0.1:1"}); err == nil {
		t.Fatal("a configuration without a bind line accepted")
	}
}
