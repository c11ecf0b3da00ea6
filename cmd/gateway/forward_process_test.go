package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/internal/freeport"
	"github.com/devicegate/devicegate/internal/kafkatest"
	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/natstest"
	"github.com/devicegate/devicegate/internal/poll"
)

// forwardOutage is the upstream outage of TestForwardOutageProcess: 5 s
// in `make test`; the 30 s with DEVICEGATE_FORWARD_OUTAGE=30s
// (`make test-forward-outage`).
func forwardOutage(t *testing.T) time.Duration {
	return envDuration(t, "DEVICEGATE_FORWARD_OUTAGE", 5*time.Second)
}

// envDuration is the duration in the environment variable key, or def
// when it is not set.
func envDuration(t *testing.T, key string, def time.Duration) time.Duration {
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < time.Second {
		t.Fatalf("%s=%q: want a duration of 1s or more", key, v)
	}
	return d
}

// upstreamLog records, per device, the sequence numbers that arrive at
// the upstream, in arrival order.
type upstreamLog struct {
	mu  sync.Mutex
	got map[string][]int
}

func (u *upstreamLog) add(topic string, payload []byte) {
	n := payloadNumber(payload)
	u.mu.Lock()
	u.got[topic] = append(u.got[topic], n)
	u.mu.Unlock()
}

// set replaces the arrivals with got, read again from the destination.
func (u *upstreamLog) set(got map[string][]int) {
	u.mu.Lock()
	u.got = got
	u.mu.Unlock()
}

// payloadNumber is the sequence number of a fleet's message: its
// payload up to a ':' (padding may follow).
func payloadNumber(p []byte) int {
	if i := bytes.IndexByte(p, ':'); i >= 0 {
		p = p[:i]
	}
	n, _ := strconv.Atoi(string(p))
	return n
}

// check reports, per device, whether every acknowledged sequence number
// arrived, whether first arrivals are in order, and the duplicates.
func (u *upstreamLog) check(acked map[string]int) (missing int, outOfOrder string, dups int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for topic, last := range acked {
		seen := map[int]bool{}
		prev := 0
		for _, n := range u.got[topic] {
			if seen[n] {
				dups++
				continue
			}
			seen[n] = true
			if n < prev && outOfOrder == "" {
				outOfOrder = fmt.Sprintf("%s: %d arrived first after %d", topic, n, prev)
			}
			prev = max(prev, n)
		}
		for n := 1; n <= last; n++ {
			if !seen[n] {
				missing++
			}
		}
	}
	return missing, outOfOrder, dups
}

// missingSample names a few acknowledged messages that did not arrive.
func (u *upstreamLog) missingSample(acked map[string]int) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for topic, last := range acked {
		seen := map[int]bool{}
		for _, n := range u.got[topic] {
			seen[n] = true
		}
		for n := 1; n <= last && len(out) < 10; n++ {
			if !seen[n] {
				out = append(out, fmt.Sprintf("%s #%d (of %d acked, %d arrivals: %v)", topic, n, last, len(u.got[topic]), u.got[topic]))
			}
		}
	}
	return strings.Join(out, "; ")
}

// fleet is MQTT 5 devices publishing numbered QoS 1 messages to a
// gateway whose process may die: each resends a message until it is
// acknowledged with success, reconnecting as needed, and remembers the
// last acknowledged number. (MQTT 5, because an MQTT 3.1.1 device is
// acknowledged for a message its quota drops.)
type fleet struct {
	acked   []atomic.Int64
	sent    atomic.Int64
	refused atomic.Int64 // publishes refused over quota (0x97)
	stop    chan struct{}
	wg      sync.WaitGroup
	topics  []string
}

func startFleet(addr string, devices int, every time.Duration) *fleet {
	return startFleetOf(addr, fleetIDs(devices), every, nil)
}

// startFleetPadded is startFleet with payloads of the number, ':' and
// pad bytes.
func startFleetPadded(addr string, devices int, every time.Duration, pad int) *fleet {
	padding := ":" + strings.Repeat("p", pad)
	return startFleetOf(addr, fleetIDs(devices), every, func(_ string, n int) []byte { return []byte(strconv.Itoa(n) + padding) })
}

// fleetIDs are the client IDs dev-00 to dev-(n-1).
func fleetIDs(n int) []string {
	var ids []string
	for i := range n {
		ids = append(ids, fmt.Sprintf("dev-%02d", i))
	}
	return ids
}

// startFleetOf starts a device per ID; payload, when not nil, makes
// device id's message n (whose payload must begin with n and ':').
func startFleetOf(addr string, ids []string, every time.Duration, payload func(id string, n int) []byte) *fleet {
	f := &fleet{acked: make([]atomic.Int64, len(ids)), stop: make(chan struct{})}
	if payload == nil {
		payload = func(_ string, n int) []byte { return []byte(strconv.Itoa(n)) }
	}
	for i, id := range ids {
		f.topics = append(f.topics, "devices/"+id+"/t")
		f.wg.Go(func() { f.device(addr, id, &f.acked[i], every, payload) })
	}
	return f
}

func (f *fleet) device(addr, id string, acked *atomic.Int64, every time.Duration, payload func(string, int) []byte) {
	var c *paho.Client
	defer func() {
		if c != nil {
			_ = c.Disconnect(&paho.Disconnect{})
		}
	}()
	tick := time.NewTicker(every)
	defer tick.Stop()
	n := 1
	for {
		select {
		case <-f.stop:
			return
		case <-tick.C:
		}
		if c == nil {
			c = connect5(addr, id)
			if c == nil {
				continue
			}
		}
		f.sent.Add(1)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := c.Publish(ctx, &paho.Publish{Topic: "devices/" + id + "/t", QoS: 1, Payload: payload(id, n)})
		cancel()
		switch {
		case err == nil:
			acked.Store(int64(n))
			n++
		case resp != nil && resp.ReasonCode == 0x97:
			// Over quota (after a crash the gateway charges each device
			// its quota): refused, sent again at the next tick.
			f.refused.Add(1)
		default:
			_ = c.Disconnect(&paho.Disconnect{}) // no acknowledgement: send n again on a new connection
			c = nil
		}
	}
}

// connect5 connects an MQTT 5 device, or returns nil.
func connect5(addr, id string) *paho.Client {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil
	}
	c := paho.NewClient(paho.ClientConfig{ClientID: id, Conn: conn})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil {
		conn.Close()
		return nil
	}
	return c
}

func (f *fleet) halt() map[string]int {
	close(f.stop)
	f.wg.Wait()
	out := map[string]int{}
	for i, topic := range f.topics {
		out[topic] = int(f.acked[i].Load())
	}
	return out
}

// TestForwardStreamOutageProcess is TestForwardOutageProcess with a
// stream as the destination (issue 16), the gateway killed during the
// outage and during the replay: a real redis-server, a real nats-server
// with JetStream and franz-go's kfake as Kafka, each stopped for the
// outage and started again on its store. Every acknowledged
// message is in the stream, in order per device; in NATS exactly once,
// thanks to the message IDs.
func TestForwardStreamOutageProcess(t *testing.T) {
	const devices = 50
	for _, c := range []struct {
		name string
		dest func(*testing.T, int) outageDest
	}{{"redis", redisDest}, {"nats", natsDest}, {"kafka", kafkaDest}} {
		t.Run(c.name, func(t *testing.T) { forwardOutageRun(t, forwardOutage(t), true, c.dest(t, devices)) })
	}
}

// TestForwardOutageProcess is the acceptance run with a real
// gateway process, a real Mosquitto upstream and a backend subscribed
// upstream with a persistent session: 50 devices publish QoS 1 while the
// upstream is stopped for an outage (5 s here, 30 s with
// DEVICEGATE_FORWARD_OUTAGE=30s), then restarted; in the second run the
// gateway is also killed (SIGKILL) during the outage and again during
// the paced replay. Every acknowledged message must arrive upstream,
// each device's first arrivals in order; duplicates are counted.
func TestForwardOutageProcess(t *testing.T) {
	outage := forwardOutage(t)
	for _, kill := range []bool{false, true} {
		name := "outage"
		if kill {
			name = "outage and kill -9 twice"
		}
		t.Run(name, func(t *testing.T) { forwardOutageRun(t, outage, kill, mosquittoDest(t)) })
	}
}

// outageDest is the destination of a forwarding outage run: the
// forward: entry's to and extra keys, how to take it down and up, and
// the arrivals (refresh, when not nil, reads them again into the log).
type outageDest struct {
	to, extra string
	down, up  func()
	log       *upstreamLog
	refresh   func()
	// exactlyOnce: the destination drops what the forwarder sends again
	// (the same message ID); a device's own resend of a message whose
	// acknowledgement a crash lost is another message, with an ID of
	// its own.
	exactlyOnce bool
}

// mosquittoDest is a real Mosquitto with a backend subscriber on a
// persistent session; down stops the process, up starts it again.
func mosquittoDest(t *testing.T) outageDest {
	up := mosquittotest.StartWith(t, mosquittotest.Options{Persist: true})
	log := &upstreamLog{got: map[string][]int{}}
	back := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + up.Addr).SetClientID("backend").SetCleanSession(false).
		SetAutoReconnect(true).SetMaxReconnectInterval(100 * time.Millisecond).SetOrderMatters(true))
	if tok := back.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("backend: %v", tok.Error())
	}
	t.Cleanup(func() { back.Disconnect(0) })
	if tok := back.Subscribe("devices/#", 1, func(_ mqtt.Client, m mqtt.Message) { log.add(m.Topic(), m.Payload()) }); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("backend subscribe: %v", tok.Error())
	}
	return outageDest{to: "mqtt://" + up.Addr, down: up.Stop, up: up.Restart, log: log}
}

// redisDest is a real redis-server with an append-only file; down
// kills it, up starts it again on its file; the arrivals are the
// devices' streams.
func redisDest(t *testing.T, devices int) outageDest {
	srv := redistest.StartDurable(t)
	d := outageDest{to: "redis://" + srv.Addr, extra: `, stream: "{topic}"`, down: srv.Kill, up: srv.Restart, log: &upstreamLog{}}
	c := srv.Client()
	d.refresh = func() {
		got := map[string][]int{}
		for i := range devices {
			topic := fmt.Sprintf("devices/dev-%02d/t", i)
			msgs, err := c.XRange(context.Background(), topic, "-", "+").Result()
			if err != nil {
				t.Fatalf("XRANGE %s: %v", topic, err)
			}
			for _, m := range msgs {
				n, _ := strconv.Atoi(m.Values["payload"].(string))
				got[topic] = append(got[topic], n)
			}
		}
		d.log.set(got)
	}
	return d
}

// natsDest is a real nats-server with a JetStream stream of the
// devices' subjects; down kills it, up starts it again on its store;
// the arrivals are read by an ordered consumer, once the server is up.
func natsDest(t *testing.T, _ int) outageDest {
	srv := natstest.Start(t)
	srv.CreateStream("DEVICES", "devices.>")
	d := outageDest{to: srv.URL, down: srv.Kill, up: srv.Restart, log: &upstreamLog{got: map[string][]int{}}, exactlyOnce: true}
	var cons jetstream.Consumer
	ids := map[string]bool{}
	d.refresh = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if cons == nil {
			var err error
			if cons, err = srv.JetStream().OrderedConsumer(ctx, "DEVICES", jetstream.OrderedConsumerConfig{}); err != nil {
				t.Fatalf("consumer: %v", err)
			}
		}
		for {
			batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(200*time.Millisecond))
			if err != nil {
				t.Fatalf("fetch: %v", err)
			}
			n := 0
			for m := range batch.Messages() {
				if id := m.Headers().Get(jetstream.MsgIDHeader); ids[id] {
					t.Errorf("message ID %s stored twice: the stream's de-duplication did not hold", id)
				} else {
					ids[id] = true
				}
				d.log.add(m.Headers().Get("topic"), m.Data())
				n++
			}
			if n == 0 {
				return
			}
		}
	}
	return d
}

// kafkaDest is franz-go's kfake (no Kafka broker can be installed
// here) with the topic telemetry in three partitions; down closes it, up
// starts it again on its data; the arrivals are the records' values by
// their topic header.
func kafkaDest(t *testing.T, _ int) outageDest {
	k := kafkatest.Start(t, 3, []string{"telemetry"})
	d := outageDest{to: "kafka://" + k.Addr, extra: `, kafka_topic: telemetry`, down: k.Close, up: k.Restart, log: &upstreamLog{}}
	d.refresh = func() {
		got := map[string][]int{}
		for _, r := range k.Records("telemetry") {
			n, _ := strconv.Atoi(string(r.Value))
			topic := string(r.Headers[1].Value)
			got[topic] = append(got[topic], n)
		}
		d.log.set(got)
	}
	return d
}

func forwardOutageRun(t *testing.T, outage time.Duration, kill bool, dest outageDest) {
	const devices, every, rate = 50, 100 * time.Millisecond, 1500
	log := dest.log
	refresh := func() {
		if dest.refresh != nil {
			dest.refresh()
		}
	}

	dir := t.TempDir()
	conf := filepath.Join(t.TempDir(), "gateway.yaml")
	yaml := fmt.Sprintf("forward: [{name: cloud, to: %q, topics: [\"devices/#\"], rate: %d%s}]\n", dest.to, rate, dest.extra)
	if err := os.WriteFile(conf, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", conf, "--mqtt-addr", addr, "--limit", "1000", "--window", "1s"}
	g := startGW(t, dir, args...)
	backlog := func() (forwarded, waiting float64) {
		code, v := g.call(t, "GET", "/api/v1/forward", "")
		if code != 200 {
			t.Fatalf("GET /api/v1/forward: %d %v", code, v)
		}
		u := v["upstreams"].([]any)[0].(map[string]any)
		return u["forwarded"].(float64), u["backlog_messages"].(float64)
	}
	poll.Until(t, 10*time.Second, "the upstream connection", func() bool {
		_, v := g.call(t, "GET", "/api/v1/forward", "")
		return strings.Contains(fmt.Sprint(v), "connected:1")
	})

	f := startFleet(addr, devices, every)
	poll.Until(t, 20*time.Second, "traffic upstream", func() bool { fw, _ := backlog(); return fw > 500 })
	dest.down()
	start := time.Now()
	kills := 0
	if kill {
		poll.Until(t, outage, "a backlog", func() bool { _, w := backlog(); return w > 100 })
		_, before := backlog()
		g.kill()
		kills++
		g = startGW(t, dir, args...)
		_, after := backlog()
		t.Logf("backlog %v before the kill, %v after the restart", before, after)
	}
	time.Sleep(time.Until(start.Add(outage))) // the outage's length is the test's subject
	if kill {
		// After the first kill the devices are refused for a while (the
		// crash charge): let a replay's worth wait, so that the second
		// kill can land in the replay.
		poll.Until(t, 30*time.Second, "a backlog of 500 to replay", func() bool { _, w := backlog(); return w >= 500 })
	}
	_, during := backlog()
	dest.up()
	if kill {
		// Killed as soon as the replay has begun, with most of the
		// backlog still waiting.
		poll.Until(t, 20*time.Second, "the replay under way", func() bool { fw, _ := backlog(); return fw > 0 })
		_, w := backlog()
		if w == 0 {
			t.Fatalf("the replay is over (the backlog was %v at the end of the outage): the kill would not land in it", during)
		}
		t.Logf("killed during the replay with %v waiting", w)
		g.kill()
		kills++
		g = startGW(t, dir, args...)
	}
	poll.Until(t, 60*time.Second, "the backlog drained", func() bool { _, w := backlog(); return w < 50 })
	acked := f.halt()
	total := 0
	for _, n := range acked {
		total += n
	}
	var missing, dups int
	var order string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) { // polling the subscriber
		refresh()
		if missing, order, dups = log.check(acked); missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			_, w := backlog()
			t.Fatalf("%d acknowledged messages never arrived upstream (%d waiting in the forward log): %s", missing, int(w), log.missingSample(acked))
		}
	}
	g.stop()
	if order != "" {
		t.Fatalf("out of order: %s", order)
	}
	// Duplicates come only from what was in flight when a connection
	// broke: the forwarder's window (max_inflight: 100 for MQTT, 1000
	// for a stream) per break, and a device's one message per kill.
	window := 1000
	if strings.HasPrefix(dest.to, "mqtt") {
		window = 100
	}
	bound := window*(2+kills) + devices*kills
	if dest.exactlyOnce {
		// The forwarder's resends are dropped (the IDs are checked as
		// they are read); what remains are the devices' own resends.
		bound = devices * kills
	}
	if dups > bound {
		t.Fatalf("%d duplicates, more than %d (exactly once for the forwarder's resends: %v)", dups, bound, dest.exactlyOnce)
	}
	t.Logf("%d devices, outage %s, %d kills: %d acknowledged messages, all upstream in order, %d duplicates; backlog at the end of the outage %.0f; %d publishes refused over quota after crashes",
		devices, outage, kills, total, dups, during, f.refused.Load())
}
