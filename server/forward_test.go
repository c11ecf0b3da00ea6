package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/devicegate/devicegate/auth"
	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/forward"
	"github.com/devicegate/devicegate/internal/freeport"
	"github.com/devicegate/devicegate/internal/kafkatest"
	"github.com/devicegate/devicegate/internal/logtest"
	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/mqtttest"
	"github.com/devicegate/devicegate/internal/natstest"
	"github.com/devicegate/devicegate/internal/poll"
	"github.com/devicegate/devicegate/internal/testcert"
)

// TestForwardUpstream: a gateway configured with forward: hands the
// device's acknowledged messages on to a real Mosquitto under the remote
// prefix, in order, also through an outage of the upstream during which
// the device keeps getting its acknowledgements.
func TestForwardUpstream(t *testing.T) {
	up := mosquittotest.Start(t)
	upstream := subscribeUpstream(t, up.Addr, "site-7/devices/#", func(m mqtt.Message) string { return m.Topic() + " " + string(m.Payload()) })

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
			seen := map[string]bool{}
			for _, s := range upstream() {
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
	prev := 0
	seen := map[string]bool{}
	for _, s := range upstream() {
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

// subscribeUpstream subscribes a client to filter on the upstream
// broker at addr at QoS 1 and returns what arrived so far, each message
// as format gives it, in arrival order.
func subscribeUpstream(t *testing.T, addr, filter string, format func(mqtt.Message) string) func() []string {
	t.Helper()
	var mu sync.Mutex
	var got []string
	sub := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("backend").SetOrderMatters(true))
	if tok := sub.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("upstream subscriber: %v", tok.Error())
	}
	t.Cleanup(func() { sub.Disconnect(0) })
	if tok := sub.Subscribe(filter, 1, func(_ mqtt.Client, m mqtt.Message) {
		mu.Lock()
		got = append(got, format(m))
		mu.Unlock()
	}); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe upstream: %v", tok.Error())
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}

// TestForwardRefusedLogin: an upstream that refuses the gateway's
// password does not stop the gateway: devices are acknowledged (their
// messages wait in the forward log), the log and GET /api/v1/forward say
// why nothing is forwarded, and the same failure is logged once, not on
// every retry.
func TestForwardRefusedLogin(t *testing.T) {
	up := mosquittotest.StartWith(t, mosquittotest.Options{Users: map[string]string{"gw": "right"}})
	cfg := testConfig(t.TempDir(), 1000, time.Hour)
	cfg.Forward = []config.Forward{{Name: "cloud", To: "mqtt://" + up.Addr, Topics: []string{"devices/#"}, MaxQoS: 1,
		Username: "gw", PasswordEnv: "DEVICEGATE_TEST_UPSTREAM_PASSWORD"}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.Admin.Token = "test-token"
	t.Setenv("DEVICEGATE_TEST_UPSTREAM_PASSWORD", "wrong")
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
	st := g.forward.Stats()[0]
	if st.Connected != 0 || st.Backlog != 5 || !strings.Contains(strings.ToLower(st.LastError), "not authorized") {
		t.Fatalf("forward state %+v, want not connected, the 5 messages waiting and why", st)
	}
	api := httpGet(t, "http://"+g.AdminAddr().String()+"/api/v1/forward", cfg.Admin.Token)
	if !strings.Contains(strings.ToLower(api), `"last_error":"connect to mqtt://`+up.Addr+`: not authorized`) {
		t.Fatalf("GET /api/v1/forward = %s, want the reason", api)
	}
	poll.Until(t, 20*time.Second, "several retries", func() bool { return retries(g) >= 3 })
	if n := logs.Count("upstream unavailable; messages wait in the forward log"); n != 1 {
		t.Fatalf("the same failure logged %d times, want once", n)
	}
}

// TestForwardMaxBackoff: forward's max_backoff caps the wait between
// attempts to reach a destination that is down, and the admin API says
// when the next attempt comes. Seven attempts in, the default backoff
// (doubling from 100 ms) would wait 3.2 to 6.4 s; at max_backoff 1s the
// wait is at most 1 s.
func TestForwardMaxBackoff(t *testing.T) {
	dead, err := freeport.Addr() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t.TempDir(), 1000, time.Hour)
	cfg.Forward = []config.Forward{{Name: "cloud", To: "mqtt://" + dead, Topics: []string{"devices/#"}, MaxQoS: 1,
		MaxBackoff: config.Duration(time.Second)}}
	cfg.Admin.Token = "test-token"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := mustStart(t, cfg, Deps{})
	poll.Until(t, 20*time.Second, "seven attempts", func() bool { return retries(g) >= 7 })
	poll.Until(t, 5*time.Second, "a wait for the next attempt", func() bool { return g.forward.Stats()[0].RetryIn > 0 })
	if st := g.forward.Stats()[0]; st.RetryIn > time.Second || st.LastError == "" {
		t.Fatalf("after %d attempts: retry in %s (%q); want at most max_backoff, 1s", retries(g), st.RetryIn, st.LastError)
	}
	api := httpGet(t, "http://"+g.AdminAddr().String()+"/api/v1/forward", cfg.Admin.Token)
	if !strings.Contains(api, `"retry_in_seconds":`) {
		t.Fatalf("GET /api/v1/forward = %s, want retry_in_seconds", api)
	}
}

// retries counts the upstream connection attempts of the gateway's
// first upstream.
func retries(g *Gateway) uint64 { return g.forward.Routes()[0].Conns[0].Attempts() }

// TestForwardMutualTLS: an mqtts:// upstream that requires a client
// certificate (as AWS IoT Core does) takes the gateway's, issued by the
// test CA, and gets the device's messages; without the certificate the
// gateway says why it cannot forward.
func TestForwardMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, "upstream CA")
	caFile := ca.WriteCA(t, dir, "ca.pem")
	srvCert, srvKey := testcert.WritePair(t, dir, "upstream", ca.Issue(t, "upstream", nil, true))
	gwCert, gwKey := testcert.WritePair(t, dir, "gateway", ca.Issue(t, "github.com/devicegate/devicegate", nil, false))
	up := mosquittotest.StartWith(t, mosquittotest.Options{TLS: &mosquittotest.TLS{CAFile: caFile, CertFile: srvCert, KeyFile: srvKey, RequireCert: true}})

	got := make(chan string, 10)
	subCfg, err := auth.ClientTLS(caFile, gwCert, gwKey, "")
	if err != nil {
		t.Fatal(err)
	}
	sub := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("ssl://" + up.Addr).SetClientID("backend").SetTLSConfig(subCfg))
	if tok := sub.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("upstream subscriber: %v", tok.Error())
	}
	defer sub.Disconnect(0)
	if tok := sub.Subscribe("devices/#", 1, func(_ mqtt.Client, m mqtt.Message) { got <- string(m.Payload()) }); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe upstream: %v", tok.Error())
	}

	for _, c := range []struct {
		name     string
		tls      config.ForwardTLS
		delivers bool
	}{
		{"with the client certificate", config.ForwardTLS{CAFile: caFile, CertFile: gwCert, KeyFile: gwKey}, true},
		{"without it", config.ForwardTLS{CAFile: caFile}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t.TempDir(), 1000, time.Hour)
			cfg.Forward = []config.Forward{{Name: "cloud", To: "mqtts://" + up.Addr, Topics: []string{"devices/#"}, MaxQoS: 1, TLS: c.tls}}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			g := mustStart(t, cfg, Deps{})
			dev := mqtttest.Dial5(t, g.Addr().String(), "meter-1")
			dev.MustPublish(t, "devices/meter-1/t", c.name, mqtttest.CodeSuccess)
			if !c.delivers {
				poll.Until(t, 20*time.Second, "the TLS failure reported", func() bool { return g.forward.Stats()[0].LastError != "" })
				if st := g.forward.Stats()[0]; st.Backlog != 1 || st.Connected != 0 {
					t.Fatalf("without a client certificate: %+v", st)
				}
				t.Logf("without a client certificate: %s", g.forward.Stats()[0].LastError)
				return
			}
			select {
			case m := <-got:
				if m != c.name {
					t.Fatalf("upstream got %q", m)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("nothing upstream over mutual TLS; forward state %+v", g.forward.Stats()[0])
			}
		})
	}
}

// TestForwardConnections: with connections: 3 every device goes through
// one connection (its messages arrive in order) and the devices spread
// over the three; restarted with connections: 1 while the upstream is
// away, the gateway drains the logs of connections 1 and 2 as well, so
// nothing acknowledged is stranded.
func TestForwardConnections(t *testing.T) {
	up := mosquittotest.StartWith(t, mosquittotest.Options{Persist: true})
	var mu sync.Mutex
	got := map[string][]int{}
	sub := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + up.Addr).SetClientID("backend").SetCleanSession(false).
		SetAutoReconnect(true).SetMaxReconnectInterval(100 * time.Millisecond).SetOrderMatters(true))
	if tok := sub.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("upstream subscriber: %v", tok.Error())
	}
	defer sub.Disconnect(0)
	if tok := sub.Subscribe("devices/#", 1, func(_ mqtt.Client, m mqtt.Message) {
		n, _ := strconv.Atoi(string(m.Payload()))
		mu.Lock()
		got[m.Topic()] = append(got[m.Topic()], n)
		mu.Unlock()
	}); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe upstream: %v", tok.Error())
	}
	dir := t.TempDir()
	cfg := testConfig(dir, 1000, time.Hour)
	cfg.Forward = []config.Forward{{Name: "cloud", To: "mqtt://" + up.Addr, Topics: []string{"devices/#"}, MaxQoS: 1, Connections: 3}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	const devices, each = 12, 20
	publish := func(g *Gateway, from int) {
		for d := range devices {
			dev := mqtttest.Dial5(t, g.Addr().String(), "meter-"+strconv.Itoa(d))
			for i := from; i < from+each; i++ {
				dev.MustPublish(t, "devices/meter-"+strconv.Itoa(d)+"/t", strconv.Itoa(i), mqtttest.CodeSuccess)
			}
			dev.Close()
		}
	}
	complete := func(n int) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			for d := range devices {
				seen := map[int]bool{}
				for _, v := range got["devices/meter-"+strconv.Itoa(d)+"/t"] {
					seen[v] = true
				}
				if len(seen) != n {
					return false
				}
			}
			return true
		}
	}
	g, err := Start(cfg, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 20*time.Second, "three connections up", func() bool { return g.forward.Stats()[0].Connected == 3 })
	publish(g, 0)
	poll.Until(t, 20*time.Second, "every message upstream", complete(each))
	used := 0
	for _, f := range g.forward.Routes()[0].Conns {
		if f.Forwarded() > 0 {
			used++
		}
	}
	if used < 2 {
		t.Fatalf("%d devices went through %d of 3 connections", devices, used)
	}

	up.Stop()
	publish(g, each) // waits in the three logs
	closeGateway(t, g)
	cfg.Forward[0].Connections = 1
	g = mustStart(t, cfg, Deps{})
	if st := g.forward.Stats()[0]; st.Connections != 1 || st.Backlog != devices*each || len(g.forward.Routes()[0].Drain) == 0 {
		t.Fatalf("after the restart with one connection: %+v, %d draining", st, len(g.forward.Routes()[0].Drain))
	}
	up.Restart()
	poll.Until(t, 30*time.Second, "the stranded logs drained", complete(2*each))
	mu.Lock()
	defer mu.Unlock()
	for topic, vs := range got {
		prev := -1
		seen := map[int]bool{}
		for _, v := range vs {
			if seen[v] {
				continue
			}
			seen[v] = true
			if v < prev {
				t.Fatalf("%s: %d arrived first after %d", topic, v, prev)
			}
			prev = v
		}
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
	poll.Until(t, 20*time.Second, "the upstream connection", func() bool { return g.forward.Stats()[0].Connected == 1 })

	got := make(chan string, 4)
	mqtttest.Subscribe5(t, g.Addr().String(), "meter-1", paho.SubscribeOptions{Topic: "devices/meter-1/cmd", QoS: 1}, func(p *paho.Publish) {
		got <- p.Topic + " " + string(p.Payload)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
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
	away, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
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

// TestForwardMQTT5: with mqtt_version "5" the gateway speaks MQTT 5 to
// the upstream (a real Mosquitto) and carries the device's message
// properties: an MQTT 5 subscriber upstream sees the content type, user
// properties, correlation data, response topic and payload format the
// device sent, and the retain flag.
func TestForwardMQTT5(t *testing.T) {
	up := mosquittotest.Start(t)
	got := make(chan *paho.Publish, 4)
	mqtttest.Subscribe5(t, up.Addr, "backend", paho.SubscribeOptions{Topic: "site-7/#", QoS: 1, RetainAsPublished: true}, func(p *paho.Publish) { got <- p })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := testConfig(t.TempDir(), 1000, time.Hour)
	cfg.Forward = []config.Forward{{Name: "cloud", To: "mqtt://" + up.Addr, Topics: []string{"devices/#"}, MaxQoS: 1, MQTTVersion: "5",
		LocalPrefix: "devices/", RemotePrefix: "site-7/devices/"}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := mustStart(t, cfg, Deps{})
	dev := mqtttest.Dial5(t, g.Addr().String(), "meter-1")
	format := byte(1)
	sent := &paho.Publish{Topic: "devices/meter-1/t", QoS: 1, Retain: true, Payload: []byte(`{"v":1}`), Properties: &paho.PublishProperties{
		ContentType: "application/json", ResponseTopic: "devices/meter-1/reply", CorrelationData: []byte{7, 8}, PayloadFormat: &format,
		User: paho.UserProperties{{Key: "site", Value: "7"}, {Key: "unit", Value: "kWh"}}}}
	if code, err := dev.PublishPacket(sent); err != nil || code != mqtttest.CodeSuccess {
		t.Fatalf("publish: 0x%02x %v", code, err)
	}
	select {
	case p := <-got:
		pp := p.Properties
		if p.Topic != "site-7/devices/meter-1/t" || string(p.Payload) != `{"v":1}` || !p.Retain || pp == nil ||
			pp.ContentType != "application/json" || pp.ResponseTopic != "devices/meter-1/reply" || string(pp.CorrelationData) != "\a\b" ||
			pp.PayloadFormat == nil || *pp.PayloadFormat != 1 || len(pp.User) != 3 || pp.User.Get("unit") != "kWh" ||
			!strings.HasSuffix(pp.User.Get(forward.IDProperty), "/cloud/0/1") {
			t.Fatalf("upstream got %s %q retain %v, properties %+v", p.Topic, p.Payload, p.Retain, pp)
		}
	case <-ctx.Done():
		t.Fatalf("nothing upstream; forward state %+v", g.forward.Stats()[0])
	}
	poll.Until(t, 10*time.Second, "the log emptied", func() bool { st := g.forward.Stats()[0]; return st.Backlog == 0 && st.Forwarded == 1 })
}

// TestForwardPipelinedOrder: a device with many QoS 1 publishes in
// flight, forwarded (acknowledged once durable, by the connection's
// acker, without holding its read loop), interleaved with QoS 0 ones
// (which wait for the acker): every publish is acknowledged, and a local
// subscriber and the upstream both get the device's messages in the
// order sent; a local subscriber that is the device itself, with No
// Local, gets none of its own (the acker publishes them as the device).
func TestForwardPipelinedOrder(t *testing.T) {
	up := mosquittotest.Start(t)
	upSub := newOrderSub(t, "tcp://"+up.Addr, "devices/#")
	cfg := testConfig(t.TempDir(), 100000, time.Second)
	cfg.Forward = []config.Forward{{Name: "cloud", To: "mqtt://" + up.Addr, Topics: []string{"devices/#"}, MaxQoS: 1}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := mustStart(t, cfg, Deps{})
	localSub := newOrderSub(t, "tcp://"+g.Addr().String(), "devices/#")

	dev := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + g.Addr().String()).SetClientID("meter-1").SetOrderMatters(true))
	if tok := dev.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("device: %v", tok.Error())
	}
	defer dev.Disconnect(0)
	const n = 600
	var toks []mqtt.Token
	for i := 1; i <= n; i++ {
		qos := byte(1)
		if i%10 == 0 {
			qos = 0
		}
		toks = append(toks, dev.Publish("devices/meter-1/t", qos, false, strconv.Itoa(i)))
	}
	for i, tok := range toks {
		if !tok.WaitTimeout(20*time.Second) || tok.Error() != nil {
			t.Fatalf("publish %d: no acknowledgement: %v", i+1, tok.Error())
		}
	}
	for name, s := range map[string]*orderSub{"local": localSub, "upstream": upSub} {
		poll.Until(t, 20*time.Second, name+": every message", func() bool { return s.count() == n })
		if err := s.inOrder(); err != nil {
			t.Fatalf("%s subscriber: %v", name, err)
		}
	}

	// No Local: a device subscribed to its own topic gets nothing of
	// what it publishes (the acker publishes as the device), while the
	// other local subscriber gets it.
	var own atomic.Int32
	self := mqtttest.Subscribe5(t, g.Addr().String(), "meter-2", paho.SubscribeOptions{Topic: "devices/meter-2/t", QoS: 1, NoLocal: true},
		func(*paho.Publish) { own.Add(1) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := self.Publish(ctx, &paho.Publish{Topic: "devices/meter-2/t", QoS: 1, Payload: []byte(strconv.Itoa(n + 1))}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the other local subscriber got it", func() bool { return localSub.count() == n+1 })
	if got := own.Load(); got != 0 {
		t.Fatalf("the publisher got %d of its own messages despite No Local", got)
	}
}

// orderSub records the payloads (numbers) a paho.mqtt.golang subscriber
// gets on filter.
type orderSub struct {
	mu  sync.Mutex
	got []int
}

func newOrderSub(t *testing.T, broker, filter string) *orderSub {
	t.Helper()
	s := &orderSub{}
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(broker).SetClientID("sub-" + strconv.Itoa(int(time.Now().UnixNano()%1e9))).SetOrderMatters(true))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscriber: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(0) })
	// QoS 0: a broker sends a QoS 1 subscription's messages through its
	// in-flight window and queue, and QoS 0 ones past it, which mixes
	// the two; downgraded to QoS 0 all go in the order published.
	if tok := c.Subscribe(filter, 0, func(_ mqtt.Client, m mqtt.Message) {
		v, err := strconv.Atoi(string(m.Payload()))
		if err != nil {
			return
		}
		s.mu.Lock()
		s.got = append(s.got, v)
		s.mu.Unlock()
	}); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	return s
}

func (s *orderSub) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}

func (s *orderSub) inOrder() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, v := range s.got {
		if v != i+1 {
			return fmt.Errorf("message %d is %d: out of order or missing (got %v...)", i+1, v, s.got[max(0, i-3):min(len(s.got), i+3)])
		}
	}
	return nil
}

// TestForwardToRedisStream: a gateway with a redis:// destination adds
// each acknowledged device message to the stream its template names, in
// order, with the device and topic as fields.
func TestForwardToRedisStream(t *testing.T) {
	srv := redistest.Start(t)
	forwardGateway(t, t.TempDir(), config.Forward{Name: "streams", To: "redis://" + srv.Addr + "/3", Topics: []string{"devices/#"}, MaxQoS: 1,
		Stream: "fleet:{device}", MaxLen: 100000}, 1, 50)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, DB: 3})
	defer c.Close()
	msgs, err := c.XRange(context.Background(), "fleet:meter-1", "-", "+").Result()
	if err != nil || len(msgs) != 50 {
		t.Fatalf("%d entries in the stream (%v), want 50", len(msgs), err)
	}
	for i, m := range msgs {
		if m.Values["payload"] != strconv.Itoa(i+1) || m.Values["device"] != "meter-1" || m.Values["topic"] != "devices/meter-1/t" {
			t.Fatalf("entry %d: %v", i, m.Values)
		}
	}
}

// forwardGateway starts a gateway (its data in dir) forwarding as fc,
// has the MQTT 5 device meter-1 publish payloads from to to (QoS 1,
// acknowledged with success) on devices/meter-1/t, and waits until the
// destination took them all.
func forwardGateway(t *testing.T, dir string, fc config.Forward, from, to int) *Gateway {
	t.Helper()
	cfg := testConfig(dir, 1000, time.Hour)
	cfg.Forward = []config.Forward{fc}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := mustStart(t, cfg, Deps{})
	dev := mqtttest.Dial5(t, g.Addr().String(), "meter-1")
	for i := from; i <= to; i++ {
		dev.MustPublish(t, "devices/meter-1/t", strconv.Itoa(i), mqtttest.CodeSuccess)
	}
	n := uint64(to - from + 1)
	poll.Until(t, 20*time.Second, "the forward log emptied", func() bool { st := g.forward.Stats()[0]; return st.Backlog == 0 && st.Forwarded == n })
	return g
}

// TestForwardToJetStream: a gateway with a nats:// destination stores
// its devices' messages in a real nats-server's stream, on the subject
// its template makes, each with its forward ID as Nats-Msg-Id; after a
// restart of the gateway with its log emptied, new messages get new IDs
// (the log's numbers are not reused), so the stream's de-duplication
// keeps them: the stream holds all 100, once each.
func TestForwardToJetStream(t *testing.T) {
	srv := natstest.Start(t)
	stream := srv.CreateStream("FLEET", "fleet.>")
	dir := t.TempDir()
	for run := range 2 {
		g := forwardGateway(t, dir, config.Forward{Name: "js", To: srv.URL, Topics: []string{"devices/#"}, MaxQoS: 1, Subject: "fleet.{device}"}, run*50+1, run*50+50)
		closeGateway(t, g)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ids := map[string]bool{}
	for seq := uint64(1); seq <= 100; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("message %d of 100: %v", seq, err)
		}
		id := m.Header.Get(jetstream.MsgIDHeader)
		if string(m.Data) != strconv.Itoa(int(seq)) || m.Subject != "fleet.meter-1" || ids[id] {
			t.Fatalf("message %d: %q on %s, id %q (seen before: %v)", seq, m.Data, m.Subject, id, ids[id])
		}
		ids[id] = true
	}
	if info, err := stream.Info(ctx); err != nil || info.State.Msgs != 100 {
		t.Fatalf("stream holds %d messages (%v), want 100", info.State.Msgs, err)
	}
}

// TestForwardToKafka: a gateway with a kafkas:// destination (franz-go's
// kfake over TLS, asking for a SCRAM-SHA-512 login; the password from
// the environment) produces its devices' messages as records keyed by
// device, in order, with the MQTT topic in a header, into the topic its
// template names.
func TestForwardToKafka(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, "kafka CA")
	caFile := ca.WriteCA(t, dir, "ca.pem")
	srvTLS := &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "kafka", nil, true)}}
	k := kafkatest.Start(t, 2, []string{"fleet.meter-1"}, kfake.TLS(srvTLS), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "gw", "s3cret"))
	t.Setenv("KAFKA_PASSWORD", "s3cret")
	forwardGateway(t, t.TempDir(), config.Forward{Name: "kafka", To: "kafkas://" + k.Addr, Topics: []string{"devices/#"}, MaxQoS: 1,
		KafkaTopic: "fleet.{device}", SASL: "SCRAM-SHA-512", Username: "gw", PasswordEnv: "KAFKA_PASSWORD", TLS: config.ForwardTLS{CAFile: caFile}}, 1, 50)
	clientTLS, err := auth.ClientTLS(caFile, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	recs := k.Records("fleet.meter-1", kgo.DialTLSConfig(clientTLS), kgo.SASL(scram.Auth{User: "gw", Pass: "s3cret"}.AsSha512Mechanism()))
	if len(recs) != 50 {
		t.Fatalf("%d records, want 50", len(recs))
	}
	for i, r := range recs {
		if string(r.Value) != strconv.Itoa(i+1) || string(r.Key) != "meter-1" || r.Headers[1].Key != "topic" || string(r.Headers[1].Value) != "devices/meter-1/t" {
			t.Fatalf("record %d: key %q value %q headers %v", i, r.Key, r.Value, r.Headers)
		}
	}
}

// TestForwardToStreamsOverTLS: rediss:// and natss:// reach a real
// redis-server and nats-server that serve TLS only, the gateway
// checking their certificates against tls.ca_file; without the CA the
// connection is refused and said so in last_error.
func TestForwardToStreamsOverTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, "stream CA")
	caFile := ca.WriteCA(t, dir, "ca.pem")
	certFile, keyFile := testcert.WritePair(t, dir, "server", ca.Issue(t, "streams", nil, true))
	clientTLS, err := auth.ClientTLS(caFile, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	rs := redistest.StartTLS(t, certFile, keyFile, clientTLS)
	ns := natstest.StartTLS(t, certFile, keyFile, clientTLS)
	stream := ns.CreateStream("FLEET", "fleet.>")
	withCA := config.ForwardTLS{CAFile: caFile}
	t.Run("rediss", func(t *testing.T) {
		forwardGateway(t, t.TempDir(), config.Forward{Name: "r", To: "rediss://" + rs.Addr, Topics: []string{"devices/#"}, MaxQoS: 1, Stream: "fleet:{device}", TLS: withCA}, 1, 5)
		if n, err := rs.Client().XLen(context.Background(), "fleet:meter-1").Result(); err != nil || n != 5 {
			t.Fatalf("XLEN %d (%v), want 5", n, err)
		}
	})
	t.Run("natss", func(t *testing.T) {
		forwardGateway(t, t.TempDir(), config.Forward{Name: "n", To: "natss://" + ns.Addr, Topics: []string{"devices/#"}, MaxQoS: 1, Subject: "fleet.{device}", TLS: withCA}, 1, 5)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if info, err := stream.Info(ctx); err != nil || info.State.Msgs != 5 {
			t.Fatalf("stream info %+v (%v), want 5 messages", info, err)
		}
	})
	for _, fc := range []config.Forward{
		{Name: "r", To: "rediss://" + rs.Addr, Topics: []string{"devices/#"}, MaxQoS: 1},
		{Name: "n", To: "natss://" + ns.Addr, Topics: []string{"devices/#"}, MaxQoS: 1},
	} {
		scheme, _, _ := strings.Cut(fc.To, ":")
		t.Run(scheme+" without the CA", func(t *testing.T) {
			cfg := testConfig(t.TempDir(), 1000, time.Hour)
			cfg.Forward = []config.Forward{fc}
			g := mustStart(t, cfg, Deps{})
			poll.Until(t, 20*time.Second, "the TLS failure reported", func() bool {
				return strings.Contains(g.forward.Stats()[0].LastError, "certificate")
			})
		})
	}
}
