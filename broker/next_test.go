package broker

import (
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestNextMessagesAgree: before every publish of devices in each kind of
// quota (enforced, shadow, a group enforced or in shadow mode under an
// enforced or shadow device quota, a topic class, policy defer with and
// without a queue, a queue full by messages, by bytes and by the budget
// of all devices), NextMessages says what the publish
// then gets: admitted (0x00, counted allowed), would_refuse (0x00,
// counted would-refuse), refused (0x97), deferred (0x00, counted
// deferred).
func TestNextMessagesAgree(t *testing.T) {
	sec := time.Second
	shadow := func(q devicelimit.Quota) devicelimit.Quota { q.Shadow = true; return q }
	two := devicelimit.Quota{Limit: 2, Window: sec}
	three := devicelimit.Quota{Limit: 3, Window: sec}
	rules := []devicelimit.Rule{
		{Name: "plain", ClientID: "plain-*", Quota: two},
		{Name: "shadow", ClientID: "shadow-*", Quota: shadow(two)},
		{Name: "grp", ClientID: "grp-*", Quota: three, Group: &devicelimit.Group{Name: "g1", Quota: two}},
		{Name: "gshadow", ClientID: "gshadow-*", Quota: three, Group: &devicelimit.Group{Name: "g2", Quota: shadow(two)}},
		{Name: "dshadow", ClientID: "dshadow-*", Quota: shadow(two), Group: &devicelimit.Group{Name: "g3", Quota: three}},
		{Name: "both", ClientID: "both-*", Quota: shadow(three), Group: &devicelimit.Group{Name: "g4", Quota: shadow(two)}},
		{Name: "cls", ClientID: "cls-*", Quota: three, Classes: []devicelimit.Class{{Name: "a", Topics: []string{"a/#"}, Quota: devicelimit.Quota{Limit: 1, Window: sec}}}},
		{Name: "slow", ClientID: "slow-*", Quota: devicelimit.Quota{Limit: 1, Window: sec, Policy: devicelimit.PolicyDefer}},
	}
	f := start(t, fixtureOpts{rules: rules, store: openStore(t, t.TempDir()), limits: DeferLimits{MaxMessagesPerDevice: 2}})
	checkNext(t, f, []nextCase{
		{"plain-1", "x", 4}, {"shadow-1", "x", 4}, {"grp-1", "x", 4}, {"gshadow-1", "x", 5},
		{"dshadow-1", "x", 5}, {"both-1", "x", 5}, {"cls-1", "a/1", 3}, {"cls-1", "x", 2}, {"slow-1", "x", 5},
	})
	// A queue full by its bytes (room for one record, not two), and one
	// full by the budget of all devices (room for none): the first
	// message is deferred then refused, or refused at once.
	rec := int64(len(deferredRecord(&deferredMsg{Quota: rules[7].Quota, Version: 5, QoS: 1, Topic: "x", Payload: []byte("m")})))
	f = start(t, fixtureOpts{rules: rules, store: openStore(t, t.TempDir()), limits: DeferLimits{MaxMessagesPerDevice: 100, MaxBytesPerDevice: rec + rec/2}})
	checkNext(t, f, []nextCase{{"slow-2", "x", 4}})
	f = start(t, fixtureOpts{rules: rules, store: openStore(t, t.TempDir()), limits: DeferLimits{MaxMessagesPerDevice: 100, MaxTotalBytes: 1}})
	checkNext(t, f, []nextCase{{"slow-3", "x", 3}})
}

// nextCase is n publishes of device on topic.
type nextCase struct {
	device, topic string
	n             int
}

// checkNext publishes each case's messages through f, and before each
// compares NextMessages' outcome with what the publish gets.
func checkNext(t *testing.T, f *fixture, cases []nextCase) {
	t.Helper()
	peek := func(device, class string, ls []devicelimit.Limit, size int, now devicelimit.Tick) (devicelimit.Verdict, error) {
		return f.table.PeekAllAt(device, class, ls, size, now), nil
	}
	for _, c := range cases {
		p := f.connect(t, 5, c.device, "")
		for i := range c.n {
			next, err := f.srv.NextMessages(c.device, peek)
			if err != nil {
				t.Fatal(err)
			}
			want := next[0]
			if c.topic == "a/1" {
				want = next[1]
			}
			before := f.srv.Stats()
			a, err := p.publish(t, c.topic, "m", 1)
			if err != nil {
				t.Fatalf("%s publish %d: %v", c.device, i, err)
			}
			var after Stats
			eventually(t, "the publish counted", func() bool {
				after = f.srv.Stats()
				return after.Allowed+after.Dropped+after.Deferred+after.Overflowed > before.Allowed+before.Dropped+before.Deferred+before.Overflowed
			})
			var got string
			switch {
			case a.code == 0x97:
				got = NextRefused
			case after.Deferred > before.Deferred:
				got = NextDeferred
			case after.WouldRefuse > before.WouldRefuse:
				got = NextWouldRefuse
			case a.code == 0 && after.Allowed > before.Allowed:
				got = NextAdmitted
			}
			if got != want.Outcome {
				t.Errorf("%s, publish %d on %s: next said %+v, the publish got %s (0x%02x)", c.device, i, c.topic, want, got, a.code)
			}
		}
	}
}
