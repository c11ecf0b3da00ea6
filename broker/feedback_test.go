package broker

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"

	"github.com/devicegate/devicegate/devicelimit"
)

// fbAlways is feedback on every acknowledgement.
var fbAlways = devicelimit.Feedback{Mode: devicelimit.FeedbackAlways}

// feedbackFixture runs a broker whose devices "dev-*" have 3 messages per
// 10 s and 1000 bytes per minute, a class "telemetry" (t/#) of 2 per
// minute, and the group acme of 10 per minute; fb is their feedback.
func feedbackFixture(t *testing.T, fb devicelimit.Feedback, shadow bool) *fixture {
	q := devicelimit.WithWindows(devicelimit.PolicyDrop,
		devicelimit.Limit{Unit: devicelimit.Messages, N: 3, Window: 10 * time.Second},
		devicelimit.Limit{Unit: devicelimit.Bytes, N: 1000, Window: time.Minute})
	q.Feedback, q.Shadow = fb, shadow
	cq := devicelimit.Quota{Limit: 2, Window: time.Minute, Feedback: fb}
	gq := devicelimit.Quota{Limit: 10, Window: time.Minute}
	return start(t, fixtureOpts{rules: []devicelimit.Rule{{
		Name: "devs", ClientID: "dev-*", Quota: q,
		Classes: []devicelimit.Class{{Name: "telemetry", Topics: []string{"t/#"}, Quota: cq}},
		Group:   &devicelimit.Group{Name: "acme", Quota: gq},
	}}})
}

// fbPublish publishes at QoS 1 and returns the PUBACK's reason code,
// reason string and user properties RateLimit and RateLimit-Policy.
func fbPublish(t *testing.T, c *paho.Client, topic string, size int) (code byte, reason, rl, policy string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	resp, err := c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(strings.Repeat("x", size))})
	if resp == nil {
		t.Fatalf("publish %s: %v", topic, err)
	}
	p := resp.Properties
	return resp.ReasonCode, p.ReasonString, p.User.Get(devicelimit.RateLimitProperty), p.User.Get(devicelimit.PolicyProperty)
}

// standingOf is the RateLimit field of the table's standing for dev now.
func (f *fixture) standingOf(t *testing.T, dev, class string, size int, refused bool) string {
	t.Helper()
	qr, cs, _ := f.resolver.RuleClasses(dev, "")
	q, classes, _ := f.resolver.ContractAt(dev, qr, "devs", cs, f.clock.Now())
	if class != "" {
		c, _ := devicelimit.MatchClass(classes, "t/x")
		q = c.Quota
	}
	m := f.resolver.GroupOf(dev, "")
	var s devicelimit.Standing
	f.table.StandingAt(dev, class, q, m.Key, f.resolver.GroupQuotaAt(m, f.clock.Now()), size, refused, f.clock.Now(), &s)
	return string(s.AppendRateLimit(nil))
}

func TestFeedbackConnackAndPuback(t *testing.T) {
	f := feedbackFixture(t, fbAlways, false)
	c, connack, err := f.tryDial5(t, "dev-1", "", nil, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := `"10s";q=3;w=10, "1m-bytes";q=1000;w=60;qu="content-bytes", "telemetry/1m";q=2;w=60, "group/1m";q=10;w=60`
	if got := connack.Properties.User.Get(devicelimit.PolicyProperty); got != want {
		t.Fatalf("CONNACK RateLimit-Policy:\n got %s\nwant %s", got, want)
	}
	// t0 is a whole minute: the buckets (1 s and 6 s) start there, and
	// a count expires a window and a bucket later.
	steps := []struct {
		topic  string
		size   int
		code   byte
		rl     string
		refuse bool
	}{
		{"d/x", 10, 0, `"10s";r=2;t=11, "group/1m";r=9;t=66, "1m-bytes";r=990;t=66`, false},
		{"t/x", 5, 0, `"telemetry/1m";r=1;t=66, "group/1m";r=8;t=66`, false},
		{"t/x", 5, 0, `"telemetry/1m";r=0;t=66, "group/1m";r=7;t=66`, false},
		{"t/x", 5, 0x97, `"telemetry/1m";r=0;t=66, "group/1m";r=7;t=66`, true},
		{"d/x", 980, 0, `"1m-bytes";r=10;t=66, "10s";r=1;t=11, "group/1m";r=6;t=66`, false},
		{"d/x", 11, 0x97, `"1m-bytes";r=10;t=66, "10s";r=1;t=11, "group/1m";r=6;t=66`, true},
	}
	for i, st := range steps {
		if i == 3 {
			f.clock.Advance(500 * time.Millisecond) // t rounds up: 65.5 s is 66
		}
		code, reason, rl, policy := fbPublish(t, c, st.topic, st.size)
		if code != st.code || rl != st.rl || policy != "" {
			t.Fatalf("step %d: 0x%02x %q RateLimit %s Policy %q; want 0x%02x, RateLimit %s", i, code, reason, rl, policy, st.code, st.rl)
		}
		class := ""
		if st.topic == "t/x" {
			class = "telemetry"
		}
		if now := f.standingOf(t, "dev-1", class, st.size, st.refuse); now != rl {
			t.Fatalf("step %d: the ack says %s, the table %s", i, rl, now)
		}
		if st.refuse && !strings.HasPrefix(reason, "quota exceeded") {
			t.Fatalf("step %d: the reason string is gone: %q", i, reason)
		}
	}
	// An override reaches the device on its next acknowledgement, once.
	o := devicelimit.Override{Quota: devicelimit.Quota{Limit: 50, Window: time.Minute, Feedback: fbAlways}}
	if err := f.resolver.SetOverride("dev-1", o); err != nil {
		t.Fatal(err)
	}
	_, _, rl, policy := fbPublish(t, c, "d/x", 1)
	if want := `"1m";q=50;w=60, "telemetry/1m";q=2;w=60, "group/1m";q=10;w=60`; policy != want {
		t.Fatalf("after an override: RateLimit-Policy %q, want %s", policy, want)
	}
	// The override's window is the device's first one re-cut: its 2
	// messages stay, and this one.
	if want := `"group/1m";r=5;t=66, "1m";r=47;t=66`; rl != want {
		t.Fatalf("after an override: RateLimit %s, want %s", rl, want)
	}
	if _, _, _, policy := fbPublish(t, c, "d/x", 1); policy != "" {
		t.Fatalf("the contract again on the next ack: %s", policy)
	}
	// Its expiry is noticed too.
	o.ExpiresAt = f.clock.Now().Add(time.Second)
	if err := f.resolver.SetOverride("dev-1", o); err != nil {
		t.Fatal(err)
	}
	fbPublish(t, c, "d/x", 1)
	f.clock.Advance(time.Second)
	if _, _, _, policy := fbPublish(t, c, "d/x", 1); !strings.HasPrefix(policy, `"10s";q=3;w=10, `) {
		t.Fatalf("after the override expired: RateLimit-Policy %q", policy)
	}
}

func TestFeedbackModes(t *testing.T) {
	for _, c := range []struct {
		name  string
		fb    devicelimit.Feedback
		admit []bool // whether each of 3 admitted acks (10s window: r=2, 1, 0) carries RateLimit
	}{
		{"off", devicelimit.Feedback{Mode: devicelimit.FeedbackOff}, []bool{false, false, false}},
		{"refusals", devicelimit.Feedback{Mode: devicelimit.FeedbackRefusals}, []bool{false, false, false}},
		{"default below 25%", devicelimit.Feedback{}, []bool{false, false, true}},
		{"below 50%", devicelimit.Feedback{Mode: devicelimit.FeedbackBelow, Below: 50}, []bool{false, true, true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := feedbackFixture(t, c.fb, false)
			cl, connack, err := f.tryDial5(t, "dev-1", "", nil, nil, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := connack.Properties.User.Get(devicelimit.PolicyProperty); (got != "") != (c.fb.Mode != devicelimit.FeedbackOff) {
				t.Fatalf("CONNACK RateLimit-Policy %q", got)
			}
			for i, want := range c.admit {
				if _, _, rl, _ := fbPublish(t, cl, "d/x", 1); (rl != "") != want {
					t.Fatalf("ack %d: RateLimit %q, want one: %v", i, rl, want)
				}
			}
			code, reason, rl, _ := fbPublish(t, cl, "d/x", 1)
			if code != 0x97 || reason == "" || (rl != "") != (c.fb.Mode != devicelimit.FeedbackOff) {
				t.Fatalf("refused: 0x%02x %q RateLimit %q", code, reason, rl)
			}
		})
	}
}

func TestFeedbackShadow(t *testing.T) {
	f := feedbackFixture(t, fbAlways, true)
	c, connack, err := f.tryDial5(t, "dev-1", "", nil, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := connack.Properties.User.Get(devicelimit.PolicyProperty); !strings.HasPrefix(got, `"10s";q=3;w=10;shadow, "1m-bytes";q=1000;w=60;qu="content-bytes";shadow, "telemetry/1m";q=2;w=60, `) {
		t.Fatalf("CONNACK RateLimit-Policy %s", got)
	}
	for range 3 {
		fbPublish(t, c, "d/x", 1)
	}
	// The fourth passes (shadow mode), told what enforcing would say;
	// the group's windows, enforced, count it.
	f.clock.Advance(2 * time.Second)
	code, _, rl, _ := fbPublish(t, c, "d/x", 1)
	if want := `"10s";r=0;t=9;shadow, "group/1m";r=6;t=64, "1m-bytes";r=997;t=64;shadow`; code != 0 || rl != want {
		t.Fatalf("over the shadow quota: 0x%02x RateLimit %s, want 0x00 and %s", code, rl, want)
	}
}

// TestFeedbackPubrec: a QoS 2 PUBREC carries RateLimit, admitted or
// refused (paho's client reports the PUBCOMP of an admitted QoS 2
// publish, so this test speaks packets).
func TestFeedbackPubrec(t *testing.T) {
	f := feedbackFixture(t, fbAlways, false)
	conn, err := net.DialTimeout("tcp", f.addr, waitTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(waitTimeout))
	cp := packets.NewControlPacket(packets.CONNECT)
	cp.Content.(*packets.Connect).ClientID, cp.Content.(*packets.Connect).CleanStart = "dev-2", true
	if _, err := cp.WriteTo(conn); err != nil {
		t.Fatal(err)
	}
	if ack, err := packets.ReadPacket(conn); err != nil || ack.Type != packets.CONNACK {
		t.Fatalf("connack: %v %v", ack, err)
	}
	for i, want := range []string{
		`"telemetry/1m";r=1;t=66, "group/1m";r=9;t=66`,
		`"telemetry/1m";r=0;t=66, "group/1m";r=8;t=66`,
		`"telemetry/1m";r=0;t=66, "group/1m";r=8;t=66`, // refused: 0x97
	} {
		pp := packets.NewControlPacket(packets.PUBLISH)
		pp.Flags = 2 << 1
		pub := pp.Content.(*packets.Publish)
		pub.Topic, pub.QoS, pub.PacketID, pub.Payload = "t/x", 2, uint16(i+1), []byte("x")
		if _, err := pp.WriteTo(conn); err != nil {
			t.Fatal(err)
		}
		rp, err := packets.ReadPacket(conn)
		if err != nil || rp.Type != packets.PUBREC {
			t.Fatalf("publish %d: %v %v", i, rp, err)
		}
		rec := rp.Content.(*packets.Pubrec)
		var got string
		for _, u := range rec.Properties.User {
			if u.Key == devicelimit.RateLimitProperty {
				got = u.Value
			}
		}
		if wantCode := byte(0); i == 2 {
			wantCode = 0x97
			if rec.ReasonCode != wantCode || rec.Properties.ReasonString == "" {
				t.Fatalf("publish %d: PUBREC 0x%02x %q", i, rec.ReasonCode, rec.Properties.ReasonString)
			}
		} else if rec.ReasonCode != wantCode {
			t.Fatalf("publish %d: PUBREC 0x%02x", i, rec.ReasonCode)
		}
		if got != want {
			t.Fatalf("publish %d: PUBREC RateLimit %q, want %s", i, got, want)
		}
		if i < 2 {
			rel := packets.NewControlPacket(packets.PUBREL)
			rel.Content.(*packets.Pubrel).PacketID = uint16(i + 1)
			if _, err := rel.WriteTo(conn); err != nil {
				t.Fatal(err)
			}
			if rp, err := packets.ReadPacket(conn); err != nil || rp.Type != packets.PUBCOMP {
				t.Fatalf("pubcomp %d: %v %v", i, rp, err)
			}
		}
	}
}
