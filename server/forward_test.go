package server

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"context"
	"devicegate/config"
	"devicegate/internal/logtest"
	"devicegate/internal/mosquittotest"
	"devicegate/internal/mqtttest"
	"devicegate/internal/poll"
	"github.com/eclipse/paho.golang/paho"
	"log/slog"
	"net"
)

// TestForwardUpstream: a gateway configured with forward: hands the
// device's acknowledged messages on to a real Mosquitto under the remote
// prefix, in order, also through an outage of the upstream during which
// the device keeps getting its acknowledgements.
func TestForwardUpstream(t *testing.T) {
	up := mosquittotest.Start(t)
	var mu sync.Mutex
	var got []string
	sub := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + up.Addr).SetClientID("backend").SetOrderMatters(true))
	if tok := sub.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("upstream subscriber: %v", tok.Error())
	}
	defer sub.Disconnect(0)
	if tok := sub.Subscribe("site-7/devices/#", 1, func(_ mqtt.Client, m mqtt.Message) {
		mu.Lock()
		got = append(got, m.Topic()+" "+string(m.Payload()))
		mu.Unlock()
	}); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe upstream: %v", tok.Error())
	}

	cfg := testConfig(t.TempDir(), 1000, time.Hour)
	cfg.Forward = []config.Forward{{Name: "cloud", To: "mqtt://" + up.Addr, Topics: []string{"devices/#"},
		LocalPrefix: "devices/", RemotePrefix: "site-7/devices/", MaxQoS: 1}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := mustStart(t, cfg, Deps{})
	dev := mqtttest.Dial5(t, g.Addr().String(), "meter-1")
	for i := 1; i <= 50; i++ {
		dev.MustPublish(t, "devices/meter-1/t", strconv.Itoa(i), mqtttest.CodeSuccess)
	}
	arrived := func(n int) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			seen := map[string]bool{}
			for _, s := range got {
				seen[s] = true
			}
			return len(seen) == n
		}
	}
	poll.Until(t, 20*time.Second, "50 messages upstream", arrived(50))
	up.Pause()
	for i := 51; i <= 100; i++ { // acknowledged during the outage
		dev.MustPublish(t, "devices/meter-1/t", strconv.Itoa(i), mqtttest.CodeSuccess)
	}
	up.Resume()
	poll.Until(t, 20*time.Second, "100 messages upstream after the outage", arrived(100))
	poll.Until(t, 20*time.Second, "the forward log emptied", func() bool {
		st := g.forward.Stats()[0]
		return st.Backlog == 0 && st.Forwarded >= 100
	})
	m := httpGet(t, "http://"+g.AdminAddr().String()+"/metrics", "")
	for _, want := range []string{`devicegate_forward_connected{upstream="cloud"} 1`, `devicegate_forward_backlog_messages{upstream="cloud"} 0`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	prev := 0
	seen := map[string]bool{}
	for _, s := range got {
		if seen[s] {
			continue
		}
		seen[s] = true
		n, err := strconv.Atoi(s[len("site-7/devices/meter-1/t "):])
		if err != nil || n <= prev {
			t.Fatalf("upstream got %q after %d: out of order or mapped wrong", s, prev)
		}
		prev = n
	}
}

// TestForwardRefusedLogin: an upstream that refuses the gateway's login
// does not stop the gateway: devices are acknowledged (their messages
// wait in the forward log) and the log says why nothing is forwarded.
func TestForwardRefusedLogin(t *testing.T) {
	up := mosquittotest.StartClosed(t)
	cfg := testConfig(t.TempDir(), 1000, time.Hour)
	cfg.Forward = []config.Forward{{Name: "cloud", To: "mqtt://" + up.Addr, Topics: []string{"devices/#"}, MaxQoS: 1,
		Username: "gw", Password: "wrong"}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	logs := new(logtest.Capture)
	g := mustStart(t, cfg, Deps{Logger: slog.New(logs)})
	dev := mqtttest.Dial5(t, g.Addr().String(), "meter-1")
	for i := range 5 {
		dev.MustPublish(t, "devices/meter-1/t", strconv.Itoa(i), mqtttest.CodeSuccess)
	}
	poll.Until(t, 20*time.Second, "the refusal in the log", func() bool {
		r := logs.Find("upstream unavailable")
		return r != nil && strings.Contains(strings.ToLower(r["error"]), "not authorized")
	})
	if st := g.forward.Stats()[0]; st.Connected || st.Backlog != 5 {
		t.Fatalf("forward state %+v, want not connected and the 5 messages waiting", st)
	}
}

// TestForwardCommandDownlink: a command published upstream under the
// remote prefix reaches the device subscribed to it on the gateway, under
// the local topic, and is not forwarded upstream again.
func TestForwardCommandDownlink(t *testing.T) {
	up := mosquittotest.Start(t)
	cfg := testConfig(t.TempDir(), 1000, time.Hour)
	cfg.Forward = []config.Forward{{Name: "cloud", To: "mqtt://" + up.Addr, Topics: []string{"devices/#"}, MaxQoS: 1,
		LocalPrefix: "devices/", RemotePrefix: "site-7/devices/", Subscribe: []string{"site-7/devices/+/cmd"}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := mustStart(t, cfg, Deps{})
	poll.Until(t, 20*time.Second, "the upstream connection", func() bool { return g.forward.Stats()[0].Connected })

	got := make(chan string, 4)
	conn, err := net.DialTimeout("tcp", g.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	dev := paho.NewClient(paho.ClientConfig{ClientID: "meter-1", Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			got <- pr.Packet.Topic + " " + string(pr.Packet.Payload)
			return true, nil
		}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := dev.Connect(ctx, &paho.Connect{ClientID: "meter-1", CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatal(err)
	}
	defer dev.Disconnect(&paho.Disconnect{})
	if _, err := dev.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "devices/meter-1/cmd", QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	back := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + up.Addr).SetClientID("backend"))
	if tok := back.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("backend: %v", tok.Error())
	}
	defer back.Disconnect(0)
	if tok := back.Publish("site-7/devices/meter-1/cmd", 1, false, "reboot"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("command upstream: %v", tok.Error())
	}
	select {
	case m := <-got:
		if m != "devices/meter-1/cmd reboot" {
			t.Fatalf("device got %q", m)
		}
	case <-ctx.Done():
		t.Fatal("the command never reached the device")
	}
	if st := g.forward.Stats()[0]; st.Forwarded != 0 || st.Backlog != 0 {
		t.Fatalf("the command went back upstream: %+v", st)
	}
}

// TestForwardOverflow: with the upstream away and the forward log
// bounded, refuse_new tells an MQTT 5 device 0x97 once the log is full,
// and drop_oldest keeps acknowledging while it drops the oldest
// messages; both are counted in /metrics.
func TestForwardOverflow(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	away := l.Addr().String()
	l.Close()
	for _, policy := range []string{"refuse_new", "drop_oldest"} {
		t.Run(policy, func(t *testing.T) {
			cfg := testConfig(t.TempDir(), 1000, time.Hour)
			cfg.Forward = []config.Forward{{Name: "cloud", To: "mqtt://" + away, Topics: []string{"devices/#"}, MaxQoS: 1,
				MaxBytes: 400, Overflow: policy}}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			g := mustStart(t, cfg, Deps{})
			dev := mqtttest.Dial5(t, g.Addr().String(), "meter-1")
			refused := 0
			for i := range 40 {
				code, err := dev.Publish("devices/meter-1/t", strconv.Itoa(1000+i))
				if err != nil {
					t.Fatal(err)
				}
				if code == mqtttest.CodeQuotaExceeded {
					refused++
				}
			}
			st := g.forward.Stats()[0]
			switch policy {
			case "refuse_new":
				if refused == 0 || st.Refused != uint64(refused) || st.BacklogBytes > 400 {
					t.Fatalf("%d refused (0x97), stats %+v; want refusals once 400 bytes are held", refused, st)
				}
				// Each publish counts once: allowed, or dropped when the
				// forward log refused it.
				if bs := g.srv.Stats(); bs.Dropped != uint64(refused) || bs.Allowed != uint64(40-refused) {
					t.Fatalf("broker stats allowed %d dropped %d, want %d and %d", bs.Allowed, bs.Dropped, 40-refused, refused)
				}
			case "drop_oldest":
				if refused != 0 {
					t.Fatalf("%d refused under drop_oldest", refused)
				}
				poll.Until(t, 10*time.Second, "the oldest dropped", func() bool {
					st = g.forward.Stats()[0]
					return st.DroppedOldest > 0 && st.BacklogBytes <= 400
				})
			}
			m := httpGet(t, "http://"+g.AdminAddr().String()+"/metrics", "")
			if !strings.Contains(m, `devicegate_forward_dropped_total{reason="refused",upstream="cloud"}`) {
				t.Errorf("/metrics lacks the forward drops")
			}
		})
	}
}
