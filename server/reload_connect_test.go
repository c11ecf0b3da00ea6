package server

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/internal/mqtttest"
)

// connectReloadFile is a configuration whose rule kept (devices k-*)
// has a quota of 1 an hour, enforced or in shadow mode, after others
// rules that match no device of the test; the default, 100,000 an
// hour, admits everything else.
func connectReloadFile(dir string, others int, enforce bool) string {
	var b strings.Builder
	for i := range others {
		fmt.Fprintf(&b, "    - {name: o%d, match: {client_id: \"o%d-*\"}, quota: {limit: 5, window: 1h}}\n", i, i)
	}
	return gatewayFile(dir, fmt.Sprintf(`  default: {limit: 100000, window: 1h, policy: drop}
  rules:
%s    - name: kept
      match: {client_id: "k-*"}
      quota: {limit: 1, window: 1h, policy: drop, enforce: %v}
`, b.String(), enforce))
}

// TestReloadWhileConnecting: round after round, devices of the rule
// kept connect (MQTT 5), one after the other in each of two chains,
// from the moment a reload has read its file until it answered; the
// file flips the rule between enforced and shadow mode. Each device's
// window is full from before, so once the reload answered, each one's
// next publish must be refused (0x97) when the file in force enforces
// the rule and admitted (0x00) when it is in shadow mode: a connection
// established while the reload puts its rules in force is judged by
// them, not by those it looked up a moment before (broker/presence.go,
// OnSessionEstablish).
//
// The race is not forced: the rules before kept lengthen a connection's
// rule lookup, so that some of the rounds land a reload in it (when
// OnSessionEstablish looked the rules up before it registered the
// connection, a few rounds in 200 did, most runs).
func TestReloadWhileConnecting(t *testing.T) {
	const others, rounds, chains, pool = 100, 200, 2, 32
	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.yaml")
	data := filepath.Join(dir, "data")
	writeWhole(t, path, connectReloadFile(data, others, true))
	cfg, err := loadFile(path)()
	if err != nil {
		t.Fatal(err)
	}
	// loaded, when set, is closed once a reload has read its file:
	// the devices connect from then on.
	var loaded atomic.Pointer[chan struct{}]
	load := func() (config.Config, error) {
		c, err := loadFile(path)()
		if ch := loaded.Swap(nil); ch != nil {
			close(*ch)
		}
		return c, err
	}
	g := mustStart(t, cfg, Deps{Load: load})
	addr := g.Addr().String()

	ids := make([][]string, chains) // each chain's devices
	for i := range ids {
		for j := range pool {
			id := fmt.Sprintf("k-%d-%d", i, j)
			c := mqtttest.Dial5(t, addr, id)
			c.MustPublish(t, "devices/"+id+"/t", "fill", 0)
			c.Close()
			ids[i] = append(ids[i], id)
		}
	}
	bad, dialed := 0, 0
	for round := range rounds {
		enforce := round%2 == 1 // even rounds put the rule in shadow mode
		writeWhole(t, path, connectReloadFile(data, others, enforce))
		want := byte(0x97)
		if !enforce {
			want = 0
		}
		ch := make(chan struct{})
		loaded.Store(&ch)
		var done atomic.Bool
		var wg sync.WaitGroup
		clients := make([][]*mqtttest.Client5, chains)
		dialErrs := make([]error, chains)
		for i := range chains {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-ch
				for _, id := range ids[i] {
					c, err := mqtttest.TryDial5(addr, id)
					if err != nil {
						dialErrs[i] = fmt.Errorf("connect %s: %w", id, err)
						return
					}
					clients[i] = append(clients[i], c)
					if done.Load() {
						return
					}
				}
			}()
		}
		_, reloadErr := g.ReloadFromSource()
		done.Store(true)
		if reloadErr != nil {
			loaded.Store(nil)
			close(ch)
		}
		wg.Wait()
		if reloadErr != nil {
			t.Fatalf("round %d: reload: %v", round, reloadErr)
		}
		if err := errors.Join(dialErrs...); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for i := range chains {
			dialed += len(clients[i])
			for j, c := range clients[i] {
				id := ids[i][j]
				code, err := c.Publish("devices/"+id+"/t", "x")
				c.Close()
				if err != nil {
					t.Fatalf("round %d: publish of %s: %v", round, id, err)
				}
				if code != want {
					bad++
					t.Errorf("round %d: rule kept enforce %v in force, %s connected during the reload: PUBACK 0x%02x, want 0x%02x", round, enforce, id, code, want)
				}
			}
		}
	}
	t.Logf("%d connections during %d reloads, %d judged by the rules before the reload", dialed, rounds, bad)
}
