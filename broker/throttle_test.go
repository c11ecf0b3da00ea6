package broker

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/logtest"
)

// The decision table of docs/design.md, policy drop: every protocol × QoS
// cell, allowed and over the limit. The throttled device publishes limit
// messages (all acked 0x00) and then `over` more (dropped: MQTT 5 QoS 1/2
// sees 0x97 on PUBACK/PUBREC, 3.1.1 sees 0x00, QoS 0 sees nothing). Then
// the clock passes the window and the same connection publishes a marker:
// it is admitted, and since mochi delivers one publisher's messages in
// order, everything that was forwarded before it has arrived by then.
func TestDropPolicy(t *testing.T) {
	const limit, over = 3, 30
	for _, version := range []int{3, 5} {
		for _, qos := range []byte{0, 1, 2} {
			t.Run(fmt.Sprintf("mqtt%d/qos%d", version, qos), func(t *testing.T) {
				t.Parallel()
				f := start(t, fixtureOpts{rules: []devicelimit.Rule{rule("dev-*", limit, devicelimit.PolicyDrop)}})
				sub := f.subscribe(t, "sub", "", "t/#")
				p := f.connect(t, version, "dev-1", "")

				want := payloads("ok", limit)
				for _, m := range want {
					a, err := p.publish(t, "t/dev-1", m, qos)
					if err != nil || a.code != 0 {
						t.Fatalf("publish %s: ack 0x%02x %q, err %v; want 0x00", m, a.code, a.reason, err)
					}
				}
				for _, m := range payloads("over", over) {
					a, err := p.publish(t, "t/dev-1", m, qos)
					if err != nil {
						t.Fatalf("publish %s: %v (the client must keep working)", m, err)
					}
					wantCode := byte(0)
					if version == 5 && qos > 0 {
						wantCode = 0x97
					}
					if a.code != wantCode {
						t.Fatalf("publish %s: ack 0x%02x, want 0x%02x", m, a.code, wantCode)
					}
					if wantCode == 0x97 {
						if !strings.HasPrefix(a.reason, "quota exceeded: 3 messages per 1s, retry after ") {
							t.Fatalf("publish %s: reason %q, want quota exceeded ... retry after", m, a.reason)
						}
					}
				}

				// QoS 0 has no ack: let the server decide them all before
				// time moves.
				f.waitDecided(t, limit+over)
				f.clock.Advance(2 * time.Second)
				if a, err := p.publish(t, "t/dev-1", "marker", qos); err != nil || a.code != 0 {
					t.Fatalf("publish after the window: ack 0x%02x %q, err %v; want 0x00", a.code, a.reason, err)
				}
				if got := sub.waitMarker(t, "marker"); !equal(got, want) {
					t.Fatalf("subscriber got %q before the marker, want %q", got, want)
				}
				st := f.srv.Stats()
				if st.Allowed != limit+1+0 || st.Dropped != over || st.Disconnected != 0 {
					t.Fatalf("stats %+v, want %d allowed, %d dropped", st, limit+1, over)
				}
				select {
				case <-p.lost():
					t.Fatal("the publisher lost its connection")
				default:
				}
			})
		}
	}
}

// The reason string's retry-after says when the window admits again.
func TestRetryAfterReason(t *testing.T) {
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{rule("dev-*", 10, devicelimit.PolicyDrop)}})
	p := f.connect(t, 5, "dev-1", "")
	for i := range 10 {
		if a, _ := p.publish(t, "t/a", fmt.Sprint(i), 1); a.code != 0 {
			t.Fatalf("publish %d: 0x%02x", i, a.code)
		}
	}
	// 10 buckets of 100ms: all ten are in the bucket at t0, which
	// leaves the counted span at t0+1.1s; at t0+650ms that is 450ms away.
	f.clock.Advance(650 * time.Millisecond)
	a, _ := p.publish(t, "t/a", "x", 1)
	if want := "quota exceeded: 10 messages per 1s, retry after 450ms"; a.code != 0x97 || a.reason != want {
		t.Fatalf("got 0x%02x %q, want 0x97 %q", a.code, a.reason, want)
	}
	// The connection reuses its last reason string only while it is
	// still true.
	f.clock.Advance(100 * time.Millisecond)
	a, _ = p.publish(t, "t/a", "y", 1)
	if want := "quota exceeded: 10 messages per 1s, retry after 350ms"; a.code != 0x97 || a.reason != want {
		t.Fatalf("100ms later: got 0x%02x %q, want 0x97 %q", a.code, a.reason, want)
	}
}

// The decision table, policy disconnect: MQTT 5 gets DISCONNECT 0x96 with
// a reason string, 3.1.1 just loses the connection; nothing over the
// limit is forwarded, and the window outlives the connection.
func TestDisconnectPolicy(t *testing.T) {
	const limit = 2
	for _, version := range []int{3, 5} {
		for _, qos := range []byte{0, 1, 2} {
			t.Run(fmt.Sprintf("mqtt%d/qos%d", version, qos), func(t *testing.T) {
				t.Parallel()
				f := start(t, fixtureOpts{rules: []devicelimit.Rule{rule("dev-*", limit, devicelimit.PolicyDisconnect)}})
				sub := f.subscribe(t, "sub", "", "t/#")
				p := f.connect(t, version, "dev-1", "")

				want := payloads("ok", limit)
				for _, m := range want {
					if a, err := p.publish(t, "t/dev-1", m, qos); err != nil || a.code != 0 {
						t.Fatalf("publish %s: ack 0x%02x, err %v", m, a.code, err)
					}
				}
				// Over the limit: no ack comes back; the connection ends.
				// Several at once: those read before the connection closed
				// are refused without a second disconnect.
				for range 5 {
					p.send("t/dev-1", "over", qos)
				}
				receive(t, "the connection to end", p.lost())
				if version == 5 {
					eventually(t, "DISCONNECT", func() bool { return p.disconnect() != nil })
					d := p.disconnect()
					if d.ReasonCode != 0x96 {
						t.Fatalf("DISCONNECT reason 0x%02x, want 0x96", d.ReasonCode)
					}
					if d.Properties == nil || !strings.HasPrefix(d.Properties.ReasonString, "message rate too high: 2 messages per 1s, retry after ") {
						t.Fatalf("DISCONNECT properties %+v, want a reason string with retry after", d.Properties)
					}
				}

				// Reconnecting does not reset the window.
				p2 := f.connect(t, version, "dev-1", "")
				p2.send("t/dev-1", "over-again", qos)
				receive(t, "the second connection to end", p2.lost())

				f.clock.Advance(2 * time.Second)
				p3 := f.connect(t, version, "dev-1", "")
				if a, err := p3.publish(t, "t/dev-1", "marker", qos); err != nil || a.code != 0 {
					t.Fatalf("publish after the window: ack 0x%02x, err %v", a.code, err)
				}
				if got := sub.waitMarker(t, "marker"); !equal(got, want) {
					t.Fatalf("subscriber got %q before the marker, want %q", got, want)
				}
				if st := f.srv.Stats(); st.Allowed != limit+1 || st.Disconnected != 2 || st.Dropped > 4 {
					t.Fatalf("stats %+v, want %d allowed, 2 disconnected, at most 4 dropped", st, limit+1)
				}
			})
		}
	}
}

// A device disconnected for its rate has its will published, as for any
// connection the server drops (MQTT-3.1.2-8): presence tracking must see
// it go offline.
func TestDisconnectPublishesWill(t *testing.T) {
	for _, version := range []int{3, 5} {
		t.Run(fmt.Sprintf("mqtt%d", version), func(t *testing.T) {
			t.Parallel()
			f := start(t, fixtureOpts{rules: []devicelimit.Rule{rule("dev-*", 1, devicelimit.PolicyDisconnect)}})
			sub := f.subscribe(t, "sub", "", "status/#")
			p := f.connectWithWill(t, version, "dev-1", "status/dev-1", "offline")
			if _, err := p.publish(t, "t/dev-1", "ok", 1); err != nil {
				t.Fatal(err)
			}
			p.send("t/dev-1", "over", 1)
			receive(t, "the connection to end", p.lost())
			eventually(t, "the will", func() bool { return sub.has("offline") })
		})
	}
}

// With identity client_id, a second connection with the same client ID
// takes the first over and inherits its window; so does a reconnect.
func TestClientIDSharesWindowAcrossTakeover(t *testing.T) {
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{rule("dev-*", 3, devicelimit.PolicyDrop)}})
	a := f.connect(t, 5, "dev-1", "")
	for i := range 2 {
		if r, _ := a.publish(t, "t/a", fmt.Sprint(i), 1); r.code != 0 {
			t.Fatalf("publish %d: 0x%02x", i, r.code)
		}
	}
	b := f.connect(t, 5, "dev-1", "") // takes over a
	eventually(t, "takeover", func() bool { return a.disconnect() != nil })
	if r, _ := b.publish(t, "t/a", "3rd", 1); r.code != 0 {
		t.Fatalf("3rd publish: 0x%02x, want 0x00", r.code)
	}
	if r, _ := b.publish(t, "t/a", "4th", 1); r.code != 0x97 {
		t.Fatalf("4th publish: 0x%02x, want 0x97", r.code)
	}
	b.close()
	other := f.connect(t, 5, "dev-2", "")
	if r, _ := other.publish(t, "t/a", "other device", 1); r.code != 0 {
		t.Fatalf("other device: 0x%02x, want 0x00", r.code)
	}
	c := f.connect(t, 3, "dev-1", "") // reconnect, other protocol
	if _, err := c.publish(t, "t/a", "after reconnect", 1); err != nil {
		t.Fatalf("after reconnect (3.1.1): %v", err)
	}
	d := f.connect(t, 5, "dev-1", "") // takes over c
	if r, _ := d.publish(t, "t/a", "after takeover", 1); r.code != 0x97 {
		t.Fatalf("after reconnect: 0x%02x, want 0x97", r.code)
	}
	if st := f.srv.Stats(); st.Allowed != 4 || st.Dropped != 3 {
		t.Fatalf("stats %+v, want 4 allowed (3 dev-1, 1 dev-2), 3 dropped", st)
	}
	if got := f.table.PeekAt("dev-1", devicelimit.Quota{Limit: 3, Window: time.Second}, f.clock.Now()); got.Count != 3 {
		t.Fatalf("window count %d, want 3", got.Count)
	}
}

// With identity username, connections with different client IDs and one
// username share a window while connected at the same time.
func TestUsernameSharesWindow(t *testing.T) {
	f := start(t, fixtureOpts{
		identity: devicelimit.IdentityUsername,
		rules:    []devicelimit.Rule{{Name: "meters", Username: "meter-*", Quota: devicelimit.Quota{Limit: 4, Window: time.Second}}},
	})
	sub := f.subscribe(t, "sub", "observer", "t/#")
	a := f.connect(t, 5, "a", "meter-7")
	b := f.connect(t, 3, "b", "meter-7")
	for i := range 2 {
		if r, _ := a.publish(t, "t/x", fmt.Sprintf("a%d", i), 1); r.code != 0 {
			t.Fatalf("a publish %d: 0x%02x", i, r.code)
		}
		if _, err := b.publish(t, "t/x", fmt.Sprintf("b%d", i), 1); err != nil {
			t.Fatalf("b publish %d: %v", i, err)
		}
	}
	if _, err := b.publish(t, "t/x", "b-over", 1); err != nil {
		t.Fatalf("b over: %v", err) // 3.1.1: acked 0x00, dropped
	}
	if r, _ := a.publish(t, "t/x", "a-over", 1); r.code != 0x97 {
		t.Fatalf("a over: 0x%02x, want 0x97", r.code)
	}
	f.clock.Advance(2 * time.Second)
	if r, _ := a.publish(t, "t/x", "marker-a", 1); r.code != 0 {
		t.Fatalf("marker a: 0x%02x", r.code)
	}
	if _, err := b.publish(t, "t/x", "marker-b", 1); err != nil {
		t.Fatalf("marker b: %v", err)
	}
	sub.waitMarker(t, "marker-a")
	sub.waitMarker(t, "marker-b")
	for _, p := range sub.payloads() {
		if strings.HasSuffix(p, "-over") {
			t.Fatalf("%s was forwarded", p)
		}
	}
	if st := f.srv.Stats(); st.Allowed != 6 || st.Dropped != 2 {
		t.Fatalf("stats %+v, want 6 allowed, 2 dropped", st)
	}
}

// With identity username, a CONNECT without a username names no device:
// MQTT 5 gets CONNACK 0x86 with a reason, 3.1.1 return code 5.
func TestUsernameRequired(t *testing.T) {
	f := start(t, fixtureOpts{identity: devicelimit.IdentityUsername})
	_, err := f.tryConnect(t, 5, "anon", "")
	if err == nil || !strings.Contains(err.Error(), "connack 0x86") || !strings.Contains(err.Error(), "username required") {
		t.Fatalf("MQTT 5 connect without username: %v, want connack 0x86 username required", err)
	}
	_, err = f.tryConnect(t, 3, "anon3", "")
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "not authorized") {
		t.Fatalf("MQTT 3.1.1 connect without username: %v, want not authorized", err)
	}
	f.connect(t, 5, "named", "u1") // the server still serves
}

// With identity client_id, an empty client ID would get a fresh random ID
// from mochi, and a fresh window, on every connect: refused.
func TestEmptyClientIDRefused(t *testing.T) {
	f := start(t, fixtureOpts{def: devicelimit.Quota{Limit: 1, Window: time.Second}})
	_, err := f.tryConnect(t, 5, "", "")
	if err == nil || !strings.Contains(err.Error(), "connack 0x85") || !strings.Contains(err.Error(), "client identifier required") {
		t.Fatalf("MQTT 5 connect with empty client ID: %v, want connack 0x85 client identifier required", err)
	}
	_, err = f.tryConnect(t, 3, "", "")
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "identifier rejected") {
		t.Fatalf("MQTT 3.1.1 connect with empty client ID: %v, want identifier rejected", err)
	}
	if n := f.table.Len(); n != 0 {
		t.Fatalf("refused connections left %d windows", n)
	}
	f.connect(t, 5, "named", "") // the server still serves
	// With identity username an empty client ID is fine: the username
	// names the device.
	g := start(t, fixtureOpts{identity: devicelimit.IdentityUsername})
	g.connect(t, 5, "", "u1")
}

// Messages the server publishes itself never count against any quota,
// even under a default quota of one message.
func TestInlineNotCounted(t *testing.T) {
	f := start(t, fixtureOpts{def: devicelimit.Quota{Limit: 1, Window: time.Second}})
	sub := f.subscribe(t, "sub", "", "t/#")
	want := payloads("inline", 20)
	for _, m := range want {
		if err := f.srv.publishInline("t/inline", []byte(m), 1); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "all inline messages", func() bool { return len(sub.payloads()) == len(want) })
	if got := sub.payloads(); !equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if st := f.srv.Stats(); st.Inline != 20 || st.Allowed != 0 || st.Dropped != 0 {
		t.Fatalf("stats %+v, want 20 inline only", st)
	}
	if n := f.table.Len(); n != 0 {
		t.Fatalf("table holds %d windows, want 0", n)
	}
}

// A runtime override takes precedence over the cached rule from the
// connection's next message, and its expiry hands the rule back.
func TestOverrideAppliesToLiveConnection(t *testing.T) {
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{rule("dev-*", 100, devicelimit.PolicyDrop)}})
	p := f.connect(t, 5, "dev-1", "")
	if r, _ := p.publish(t, "t/a", "1", 1); r.code != 0 {
		t.Fatalf("first: 0x%02x", r.code)
	}
	err := f.resolver.SetOverride("dev-1", devicelimit.Override{
		Quota:     devicelimit.Quota{Limit: 1, Window: time.Second},
		ExpiresAt: f.clock.Now().Add(time.Hour),
	})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := p.publish(t, "t/a", "2", 1)
	if r.code != 0x97 || !strings.Contains(r.reason, "1 messages per 1s") {
		t.Fatalf("under override: 0x%02x %q, want 0x97 with the override's quota", r.code, r.reason)
	}
	f.clock.Advance(time.Hour)
	if r, _ := p.publish(t, "t/a", "3", 1); r.code != 0 {
		t.Fatalf("after expiry: 0x%02x, want 0x00 under the rule", r.code)
	}
	f.srv.tick(f.clock.Now())
	if o := f.resolver.Overrides(f.clock.Now()); len(o) != 0 {
		t.Fatalf("overrides after tick: %v", o)
	}
}

// A dropped retained publish must not become the retained message.
func TestDroppedRetainedNotRetained(t *testing.T) {
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{rule("dev-*", 1, devicelimit.PolicyDrop)}})
	p := f.connect(t, 3, "dev-1", "").(*pub3)
	for _, m := range []string{"kept", "dropped"} {
		tok := p.c.Publish("t/r", 1, true, m)
		if !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
			t.Fatalf("publish %s: %v", m, tok.Error())
		}
	}
	sub := f.subscribe(t, "late", "", "t/r")
	eventually(t, "retained message", func() bool { return len(sub.payloads()) > 0 })
	if got := sub.payloads(); !equal(got, []string{"kept"}) {
		t.Fatalf("retained %q, want [kept]", got)
	}
}

// A device retrying with an empty client ID gets a fresh random ID from
// mochi on every attempt: the refusal is still logged at most once per
// refusalLogWindow, and the log limiter keeps one entry, not one per
// attempt.
func TestEmptyClientIDRefusalLoggedOnce(t *testing.T) {
	logs := new(logtest.Capture)
	f := start(t, fixtureOpts{logger: slog.New(logs)})
	for i := range 6 {
		version := 3
		if i%2 == 0 {
			version = 5
		}
		if _, err := f.tryConnect(t, version, "", ""); err == nil {
			t.Fatalf("attempt %d: connect with empty client ID accepted", i)
		}
	}
	if n := logs.Count("connection refused"); n != 1 {
		t.Fatalf("got %d \"connection refused\" lines for 6 attempts in one window, want 1", n)
	}
	if n := f.srv.hook.logs.len(); n != 1 {
		t.Fatalf("log limiter holds %d entries after 6 refused attempts from one host, want 1", n)
	}
}
