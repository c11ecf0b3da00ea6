package interop

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/devicegate/devicegate/broker"
)

const waitTimeout = 10 * time.Second

// dial3 connects an MQTT 3.1.1 device with paho.mqtt.golang.
func dial3(t *testing.T, addr, id string) mqtt.Client {
	t.Helper()
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetProtocolVersion(4).SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(waitTimeout))
	if tok := c.Connect(); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", id, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(0) })
	return c
}

// subscribe subscribes c to filter and returns the SUBACK's code.
func subscribe(t *testing.T, c mqtt.Client, filter string, h mqtt.MessageHandler) byte {
	t.Helper()
	tok := c.Subscribe(filter, 0, h)
	if !tok.WaitTimeout(waitTimeout) {
		t.Fatalf("subscribe %s: no SUBACK", filter)
	}
	return tok.(*mqtt.SubscribeToken).Result()[filter]
}

// TestStatusTopicMatchesAdmin: an MQTT 3.1.1 device (paho.mqtt.golang)
// that has sent 3 messages subscribes to its status topic and reads a
// status whose values are the admin API's status of the device; another
// device's subscription to it is refused with SUBACK 0x80.
func TestStatusTopicMatchesAdmin(t *testing.T) {
	g := startGateway(t)
	const id = "status-311"
	c := dial3(t, g.mqtt, id)
	for i := range 3 {
		if tok := c.Publish("devices/"+id+"/telemetry", 1, false, fmt.Sprintf("reading %d", i)); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	got := make(chan []byte, 4)
	if code := subscribe(t, c, broker.StatusPrefix+id, func(_ mqtt.Client, m mqtt.Message) { got <- m.Payload() }); code != 0 {
		t.Fatalf("own status topic: SUBACK 0x%02x", code)
	}
	var raw []byte
	select {
	case raw = <-got:
	case <-time.After(waitTimeout):
		t.Fatal("no status after subscribing")
	}
	var st struct {
		Policies []struct {
			Name string `json:"name"`
			Q    int    `json:"q"`
			W    int    `json:"w"`
			Unit string `json:"unit"`
		} `json:"policies"`
		Remaining []struct {
			Name string `json:"name"`
			R    int    `json:"r"`
			T    int    `json:"t"`
		} `json:"remaining"`
		Shadow, Blocked bool
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatalf("status %s: %v", raw, err)
	}
	t.Logf("status: %s", raw)
	aw := windows(t, g.device(t, id))
	if len(st.Policies) != 2 || len(st.Remaining) != 2 || st.Shadow || st.Blocked {
		t.Fatalf("status %s, admin %+v", raw, aw)
	}
	for _, p := range st.Policies {
		w, ok := aw[p.Name]
		if !ok || w.limit != p.Q || w.window != time.Duration(p.W)*time.Second || (p.Unit == "bytes") != (p.Name == "1h-bytes") {
			t.Fatalf("status policy %+v, admin %+v", p, w)
		}
	}
	// 3 of 4 messages, 3 × 9 of 1024 bytes: the message window is the
	// tightest.
	if st.Remaining[0].Name != "1h" || st.Remaining[0].R != 1 {
		t.Fatalf("status remaining %+v", st.Remaining)
	}
	for _, r := range st.Remaining {
		if w := aw[r.Name]; w.remaining != r.R || r.T <= 0 || time.Duration(r.T)*time.Second > w.window+w.window/10 {
			t.Fatalf("status remaining %+v, admin %+v", r, w)
		}
	}

	other := dial3(t, g.mqtt, "status-other")
	if code := subscribe(t, other, broker.StatusPrefix+id, func(mqtt.Client, mqtt.Message) {}); code != 0x80 {
		t.Fatalf("another device subscribes: SUBACK 0x%02x, want 0x80", code)
	}
}
