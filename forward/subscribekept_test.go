package forward

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/poll"
)

// A connection to an upstream that kept the gateway's session serves at
// once, however long the commands queued for the session take to be
// kept: the upstream sends them ahead of the SUBACK, each kept before
// the next is read. Before, the connection gave up on the SUBACK after
// its timeout (200 ms here, 5 s by default) and started the backlog
// again, for ever (a real Mosquitto; MQTT 3.1.1 and 5). And none is
// lost: commands that arrived before the SUBSCRIBE gave paho a route
// were dropped unacknowledged, and the upstream, its in-flight window
// full of them, sent nothing more (0 or 285 of 300 kept, 5 runs in 15).
func TestSubscribeKeptSessionBacklog(t *testing.T) {
	for _, v5 := range []bool{false, true} {
		t.Run(fmt.Sprintf("v5=%v", v5), func(t *testing.T) {
			up := mosquittotest.StartWith(t, mosquittotest.Options{MaxQueued: 1000})
			release := make(chan struct{})
			var kept atomic.Int64
			d := &MQTT{Address: up.Addr, ClientID: "gw", V5: v5, Persistent: true, Timeout: 200 * time.Millisecond,
				Subscribe: []string{"cmd/#"},
				Deliver: func(string, []byte, bool, byte) error {
					<-release // a slow disk: nothing is kept until the test says
					kept.Add(1)
					return nil
				}}
			ctx := context.Background()
			c, err := d.Dial(ctx) // makes the session and its subscription
			if err != nil {
				t.Fatal(err)
			}
			c.Close()

			back := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + up.Addr).SetClientID("backend"))
			if tok := back.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
				t.Fatalf("backend: %v", tok.Error())
			}
			defer back.Disconnect(0)
			const queued = 300
			for i := range queued {
				if tok := back.Publish("cmd/dev-1", 1, false, fmt.Sprint(i)); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
					t.Fatalf("command %d: %v", i, tok.Error())
				}
			}

			c, err = d.Dial(ctx)
			if err != nil {
				close(release)
				t.Fatalf("dial with %d commands queued for the kept session, none kept yet: %v", queued, err)
			}
			defer c.Close()
			close(release)
			poll.Until(t, 10*time.Second, "the queued commands kept", func() bool { return kept.Load() == queued })
			select {
			case <-c.Lost():
				t.Fatalf("the connection ended: %v", c.Reason())
			default:
			}
		})
	}
}
