package forward

import (
	"context"
	"net"
	"strings"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// TestSubscribeRefused: an upstream that refuses a command filter (a
// real mochi broker whose ACL denies it: SUBACK 0x80 over MQTT 3.1.1,
// 0x87 over MQTT 5) gets no connection that would quietly carry no
// commands: Dial fails naming the filter refused, over both protocols,
// and a connection with the allowed filter alone is made. (Mosquitto
// cannot be the upstream here: with an acl_file it grants every
// subscription and withholds the messages.) Before, the MQTT 3.1.1
// client took SUBACK 0x80 for a subscription and forwarded on with no
// command ever to come.
func TestSubscribeRefused(t *testing.T) {
	_, addr := refusingUpstream(t, "cmd/denied/#")
	for _, v5 := range []bool{false, true} {
		t.Run(protocol(v5), func(t *testing.T) {
			d := &MQTT{Address: addr, ClientID: "gw-" + protocol(v5), V5: v5,
				Subscribe: []string{"cmd/allowed/#", "cmd/denied/#"},
				Deliver:   func(string, []byte, bool, byte) error { return nil }}
			c, err := d.Dial(context.Background())
			if err == nil {
				c.Close()
				t.Fatal("a connection whose command subscription the upstream refused")
			}
			if msg := err.Error(); !strings.Contains(msg, "refused") || !strings.Contains(msg, "for cmd/denied/#") || strings.Contains(msg, "for cmd/allowed/#") {
				t.Fatalf("error %q: want the refusal, naming cmd/denied/# alone", msg)
			}
			t.Log(err)
			d.Subscribe = d.Subscribe[:1] // the same client ID, as a forwarder redials
			if c, err = d.Dial(context.Background()); err != nil {
				t.Fatalf("with the allowed filter alone: %v", err)
			}
			c.Close()
		})
	}
}

// refusingUpstream starts a mochi broker on 127.0.0.1:0 that lets every
// client in and refuses subscriptions to filter, and returns it and its
// address.
func refusingUpstream(t *testing.T, filter string) (*mqtt.Server, string) {
	t.Helper()
	return upstreamWith(t, &refuseFilter{filter: filter})
}

// upstreamWith starts a mochi broker on 127.0.0.1:0 with hook, and
// returns it and its address.
func upstreamWith(t *testing.T, hook mqtt.Hook) (*mqtt.Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := mqtt.New(&mqtt.Options{InlineClient: true}) // Publish, for the commands
	if err := srv.AddHook(hook, nil); err != nil {
		t.Fatal(err)
	}
	if err := srv.AddListener(listeners.NewNet("t", ln)); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv, ln.Addr().String()
}

// refuseFilter lets every client in and refuses its subscriptions to
// filter (a topic of it is published and read as any other).
type refuseFilter struct {
	mqtt.HookBase
	filter string
}

func (h *refuseFilter) ID() string { return "refuse-filter" }

func (h *refuseFilter) Provides(b byte) bool {
	return b == mqtt.OnConnectAuthenticate || b == mqtt.OnACLCheck
}

func (h *refuseFilter) OnConnectAuthenticate(*mqtt.Client, packets.Packet) bool { return true }

func (h *refuseFilter) OnACLCheck(_ *mqtt.Client, topic string, write bool) bool {
	return write || topic != h.filter
}
