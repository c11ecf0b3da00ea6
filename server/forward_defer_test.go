package server

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/mqtttest"
	"github.com/devicegate/devicegate/internal/poll"
)

// TestForwardDeferredAtQuota: a device at its quota under policy defer,
// forwarding to a real Mosquitto. What goes upstream is what the
// throttle admitted, then each deferred message as its window releases
// it, in the device's order and once: none of the deferred before its
// release, a publish made while older ones wait goes behind them (not
// ahead, although its window may have room), and a graceful restart
// with messages still deferred sends none of them early, none twice and
// loses none (docs/forwarding.md, "What goes"; docs/quotas.md, defer).
func TestForwardDeferredAtQuota(t *testing.T) {
	up := mosquittotest.Start(t)
	upstream := subscribeUpstream(t, up.Addr, "site-7/devices/#", func(m mqtt.Message) string { return string(m.Payload()) })

	// The release loop sleeps on a real timer for the logical time to
	// the next release (broker/release.go), so a short window: once the
	// manual clock is advanced, a release comes within about a second;
	// before, none can.
	const window = time.Second
	// step frees a window's admissions: they leave it a window after
	// their bucket ends (a few ms after they were made).
	const step = window + window/10
	dir := t.TempDir()
	cfg := testConfig(dir, 3, window)
	cfg.Limits.Default = config.Quota{Limit: 3, Window: config.Duration(window), Policy: devicelimit.PolicyDefer}
	// Messages restored at a start wait restore_delay on the clock.
	cfg.Limits.Defer.RestoreDelay = config.Duration(step)
	cfg.Forward = []config.Forward{{Name: "cloud", To: "mqtt://" + up.Addr, Topics: []string{"devices/#"},
		LocalPrefix: "devices/", RemotePrefix: "site-7/devices/", MaxQoS: 1}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	src := devicelimit.NewManualTime(start)
	g := mustStart(t, cfg, Deps{Time: src})
	// settled waits until the forward log is empty and n messages went
	// upstream in all, then checks that exactly want arrived, in order:
	// the forwarder sent nothing else (a deferred message early, one
	// twice).
	settled := func(g *Gateway, n uint64, want []string) {
		t.Helper()
		poll.Until(t, 20*time.Second, fmt.Sprintf("%d forwarded in all, the log empty", n), func() bool {
			st := g.forward.Stats()[0]
			return st.Backlog == 0 && st.Forwarded >= n && len(upstream()) >= len(want)
		})
		if st := g.forward.Stats()[0]; st.Forwarded != n {
			t.Fatalf("forwarded %d, want %d", st.Forwarded, n)
		}
		if a := upstream(); fmt.Sprint(a) != fmt.Sprint(want) {
			t.Fatalf("upstream got %v, want %v", a, want)
		}
	}
	upto := func(n int) []string {
		var s []string
		for i := 1; i <= n; i++ {
			s = append(s, strconv.Itoa(i))
		}
		return s
	}

	dev := mqtttest.Dial5(t, g.Addr().String(), "meter-1")
	for i := 1; i <= 10; i++ { // 3 admitted, 7 deferred: each acknowledged
		dev.MustPublish(t, "devices/meter-1/t", strconv.Itoa(i), mqtttest.CodeSuccess)
	}
	settled(g, 3, upto(3))

	// The window frees its 3 a step after: the next 3 go, in order. A
	// publish just after the window freed, which the release loop may
	// not have seen yet (it sleeps on a real timer), goes behind the 7
	// waiting although the window has room then.
	at := start.Add(step)
	src.Advance(step)
	waitClock(t, g, devicelimit.TickOf(at))
	dev.MustPublish(t, "devices/meter-1/t", "11", mqtttest.CodeSuccess)
	poll.Until(t, 20*time.Second, "4 to 6 released upstream", func() bool { return len(upstream()) >= 6 })
	settled(g, 6, upto(6))
	dev.Close()

	// A graceful restart with 5 deferred: none sent at the stop or the
	// start, before their window frees them and restore_delay passed.
	closeGateway(t, g)
	g = mustStart(t, cfg, Deps{Time: src})
	settled(g, 0, upto(6))
	at = at.Add(step)
	src.Advance(step)
	waitClock(t, g, devicelimit.TickOf(at))
	poll.Until(t, 20*time.Second, "7 to 9 released upstream after the restart", func() bool { return len(upstream()) >= 9 })
	settled(g, 3, upto(9))
	at = at.Add(step)
	src.Advance(step)
	waitClock(t, g, devicelimit.TickOf(at))
	poll.Until(t, 20*time.Second, "10 and 11 released upstream", func() bool { return len(upstream()) >= 11 })
	settled(g, 5, append(upto(10), "11"))
}
