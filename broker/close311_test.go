package broker

import (
	"context"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestMQTT311ClosedSilently: MQTT 3.1.1 has no DISCONNECT from the
// server (section 3.14), so every path on which the gateway ends a
// 3.1.1 connection closes it without one: a session taken over, a QoS 1
// publish the ACL refuses, a publish under $devicegate/, a shutdown.
// mochi v2.7.9 sent e0 00 before it closed on a takeover, an ACL
// refusal, a publish under $devicegate/ and a shutdown.
func TestMQTT311ClosedSilently(t *testing.T) {
	creds := credentials(t)
	f := start(t, fixtureOpts{options: func(o *Options) {
		o.Auth = Auth{Credentials: creds, ACL: defaultACL(t)}
	}})
	login := func(t *testing.T, id string) *rawClient {
		r := dialRaw(t, f.addr)
		r.send(rawConnect3(id, id, id+"-pw"))
		r.connack()
		return r
	}

	t.Run("session taken over", func(t *testing.T) {
		first := login(t, "dev-1")
		second := login(t, "dev-1")
		first.closedSilently("the session's first connection")
		second.send(rawPingreq)
		second.must(13, "PINGRESP on the second connection")
	})
	t.Run("publish the ACL refuses", func(t *testing.T) {
		r := login(t, "dev-2")
		r.send(rawPublishQ("devices/dev-1/x", 1, 7, "not mine"))
		r.closedSilently("a QoS 1 publish outside the ACL")
	})
	t.Run("publish under $devicegate/", func(t *testing.T) {
		r := login(t, "dev-2")
		r.send(rawPublishQ(StatusPrefix+"dev-2", 1, 8, `{"blocked":true}`))
		r.closedSilently("a QoS 1 publish to the status topic")
	})
	t.Run("second CONNECT", func(t *testing.T) {
		r := login(t, "dev-2")
		r.send(rawConnect3("dev-2", "dev-2", "dev-2-pw"))
		r.closedSilently("a second CONNECT (a protocol violation)")
	})
	t.Run("policy disconnect", func(t *testing.T) {
		g := start(t, fixtureOpts{rules: []devicelimit.Rule{rule("abuser", 1, devicelimit.PolicyDisconnect)}})
		r := dialRaw(t, g.addr)
		r.send(rawConnect3("abuser", "", ""))
		r.connack()
		r.send(rawPublishQ("devices/abuser", 1, 1, "a"))
		r.must(4, "PUBACK of the admitted publish")
		r.send(rawPublishQ("devices/abuser", 1, 2, "b"))
		r.closedSilently("the publish over a quota of policy disconnect")
	})
	t.Run("blocked", func(t *testing.T) {
		r := rule("flood", 1, devicelimit.PolicyDrop)
		r.Quota.Block = devicelimit.Block{After: 2, Within: time.Minute, For: time.Hour}
		g := start(t, fixtureOpts{rules: []devicelimit.Rule{r}})
		c := dialRaw(t, g.addr)
		c.send(rawConnect3("flood", "", ""))
		c.connack()
		for i := range 3 {
			c.send(rawPublishQ("devices/flood", 1, i+1, "m"))
			if i < 2 {
				c.must(4, "PUBACK") // 3.1.1: a refusal is acknowledged too
			}
		}
		c.closedSilently("a device blocked for its refusals")
	})
	t.Run("shutdown", func(t *testing.T) {
		g := start(t, fixtureOpts{})
		r := dialRaw(t, g.addr)
		r.send(rawConnect3("meter-1", "", ""))
		r.connack()
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := g.srv.Close(ctx); err != nil {
			t.Fatal(err)
		}
		r.closedSilently("a device at shutdown")
	})
}
