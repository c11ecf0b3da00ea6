package forward_test

import (
	"strconv"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/devicegate/devicegate/forward"
	"github.com/devicegate/devicegate/forward/forwardtest"
	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/mqtttest"
	"github.com/devicegate/devicegate/internal/poll"
)

// TestRefusedForGoodMQTT5: a Mosquitto upstream over MQTT 5 whose ACL
// denies one device's remote topic answers its publishes PUBACK 0x87.
// Those go to the dead-letter log, counted, while every other device's
// messages arrive once each, in order (before, the forwarder ended the
// connection and sent the log again from its start, forever); once the
// ACL allows the topic, a replay delivers them.
func TestRefusedForGoodMQTT5(t *testing.T) {
	const deny = "topic readwrite #\ntopic deny devices/bad/t\n"
	up := mosquittotest.StartWith(t, mosquittotest.Options{ACL: deny, MaxQueued: 100000})
	sub := subscribeAll(t, up.Addr)
	f, st := forwardtest.Run(t, "up/0", &forward.MQTT{Address: up.Addr, ClientID: "gw", V5: true})
	var good []string
	for i := range 19 {
		good = append(good, "dev-"+strconv.Itoa(i))
	}
	forwardtest.Refused(t, f, st, "up/0", 30, forwardtest.Refusal{Good: good, Bad: "bad", Reason: "not_authorized",
		Fix: func() {
			up.SetACL("topic readwrite #\n")
			// Mosquitto reads it again in the background: probe until
			// a publish of the topic is taken.
			probe := mqtttest.Dial5(t, up.Addr, "probe")
			poll.Until(t, 10*time.Second, "the new ACL in force", func() bool {
				code, err := probe.Publish("devices/bad/t", "probe")
				return err == nil && code == mqtttest.CodeSuccess
			})
		},
		Read: func(d string) []string {
			var out []string
			for _, p := range sub.of("devices/" + d + "/t") {
				if p != "probe" {
					out = append(out, p)
				}
			}
			return out
		}})
}

// received holds what a subscriber to devices/# got, by topic.
type received struct {
	mu  sync.Mutex
	got map[string][]string
}

// of returns the payloads received on topic, in order.
func (r *received) of(topic string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got[topic]...)
}

// subscribeAll subscribes to devices/# at QoS 1 on the MQTT broker at
// addr until the test ends.
func subscribeAll(t *testing.T, addr string) *received {
	t.Helper()
	r := &received{got: map[string][]string{}}
	sub := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("sub").SetOrderMatters(true))
	if tok := sub.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscriber: %v", tok.Error())
	}
	t.Cleanup(func() { sub.Disconnect(0) })
	if tok := sub.Subscribe("devices/#", 1, func(_ mqtt.Client, m mqtt.Message) {
		r.mu.Lock()
		r.got[m.Topic()] = append(r.got[m.Topic()], string(m.Payload()))
		r.mu.Unlock()
	}); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	return r
}
