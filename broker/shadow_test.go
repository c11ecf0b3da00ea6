package broker

import (
	"fmt"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestShadowMatchesEnforcing runs the same traffic (bursts and pauses on
// a manual clock, a message window and a topic class) through a gateway
// whose quotas are enforced (policy drop) and through one whose quotas
// are in shadow mode: the shadow one lets every message through and
// counts as would-refuse exactly the messages the enforcing one refuses,
// message by message. Under policy defer a shadow quota defers nothing:
// it decides as drop would and lets the message through.
func TestShadowMatchesEnforcing(t *testing.T) {
	enforced := runShadowTraffic(t, devicelimit.PolicyDrop, false)
	for _, policy := range []devicelimit.Policy{devicelimit.PolicyDrop, devicelimit.PolicyDefer} {
		t.Run(policy.String(), func(t *testing.T) {
			shadow := runShadowTraffic(t, policy, true)
			if enforced.delivered == enforced.sent || len(enforced.refused) == 0 {
				t.Fatalf("enforcing: %d of %d delivered, refused %v: the traffic must be refused in part", enforced.delivered, enforced.sent, enforced.refused)
			}
			if shadow.delivered != shadow.sent || len(shadow.refused) != 0 {
				t.Fatalf("shadow mode: %d of %d delivered, refused %v; want every message through", shadow.delivered, shadow.sent, shadow.refused)
			}
			if shadow.wouldRefuse != uint64(len(enforced.refused)) || shadow.wouldRefuse != shadow.stats.WouldRefuse {
				t.Fatalf("would refuse %d (stats %d), the enforcing gateway refused %d", shadow.wouldRefuse, shadow.stats.WouldRefuse, len(enforced.refused))
			}
			// All of them by the device's rule, dev-*.
			if by := shadow.stats.WouldRefuseByRule; len(by) != 2 || by["dev-*"] != shadow.wouldRefuse || by[""] != 0 {
				t.Fatalf("would refuse by rule %v, want all %d under dev-*", by, shadow.wouldRefuse)
			}
			if shadow.stats.Allowed != uint64(shadow.sent) || shadow.stats.Dropped != 0 || shadow.stats.Deferred != 0 {
				t.Fatalf("shadow stats %+v: want all %d allowed", shadow.stats, shadow.sent)
			}
			if fmt.Sprint(shadow.wouldRefuseAt) != fmt.Sprint(enforced.refused) {
				t.Fatalf("would refuse messages %v, the enforcing gateway refused %v", shadow.wouldRefuseAt, enforced.refused)
			}
		})
	}
}

type shadowRun struct {
	sent, delivered int
	refused         []int // messages the gateway refused (or deferred)
	wouldRefuse     uint64
	wouldRefuseAt   []int // messages after which would-refuse grew
	stats           Stats
}

func runShadowTraffic(t *testing.T, policy devicelimit.Policy, shadow bool) shadowRun {
	t.Helper()
	r := devicelimit.Rule{Name: "dev-*", ClientID: "dev-*",
		Quota: devicelimit.Quota{Limit: 3, Window: time.Second, Policy: policy, Shadow: shadow},
		Classes: []devicelimit.Class{{Name: "alarms", Topics: []string{"t/+/alarm"},
			Quota: devicelimit.Quota{Limit: 1, Window: time.Second, Shadow: shadow}}}}
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{r}, store: openStore(t, t.TempDir())})
	sub := f.subscribeMsgs(t, "sub", "t/#")
	p := f.connect(t, 5, "dev-1", "")
	var run shadowRun
	for i := range 24 {
		topic := "t/dev-1"
		if i%4 == 3 {
			topic = "t/dev-1/alarm"
		}
		before := f.srv.Stats().WouldRefuse
		code := publish5(t, p, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(fmt.Sprint(i))})
		run.sent++
		st := f.srv.Stats()
		if code != 0 {
			run.refused = append(run.refused, i)
		}
		if st.WouldRefuse > before {
			run.wouldRefuseAt = append(run.wouldRefuseAt, i)
		}
		if i%8 == 7 {
			f.clock.Advance(600 * time.Millisecond)
		}
	}
	run.stats = f.srv.Stats()
	run.wouldRefuse = run.stats.WouldRefuse
	run.delivered = int(run.stats.Allowed)
	sub.waitLen(t, run.delivered)
	return run
}
