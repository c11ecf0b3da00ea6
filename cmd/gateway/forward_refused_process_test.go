package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/internal/kafkatest"
	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/natstest"
	"github.com/devicegate/devicegate/internal/poll"
)

// refusedRun is how long the fleet of TestForwardRefusedProcess
// publishes: 5 s in `make test`; the 20 s with
// DEVICEGATE_REFUSED_RUN=20s (`make test-forward-refused`).
func refusedRun(t *testing.T) time.Duration {
	return envDuration(t, "DEVICEGATE_REFUSED_RUN", 5*time.Second)
}

// refusedDest is a destination that refuses one device's messages for
// good until fix removes the cause.
type refusedDest struct {
	to, extra string // the forward: entry's to and extra keys
	reason    string // the dead letters' reason
	errorText string // in the destination's error, as listed
	good      []string
	bad       string
	// pad, when set, is the padding after each of bad's numbers: a
	// message too large for the destination.
	pad     int
	fix     func()
	log     *upstreamLog
	refresh func() // reads the arrivals into log again; nil when they come by themselves
}

// TestForwardRefusedProcess: a real gateway process forwards 20 real
// devices (paho, MQTT 5, QoS 1) to a real destination that refuses one
// device's messages for good, while the devices publish for
// refusedRun: Mosquitto over MQTT 5 with an ACL that denies that
// device's topic (PUBACK 0x87), redis-server with a string at its
// stream's key (WRONGTYPE), nats-server with a stream whose
// max_msg_size its messages pass, kfake with a max.message.bytes its
// messages pass. Every other acknowledged message arrives exactly once,
// in order per device; the refused ones are the dead letters, counted
// by reason (metric), shown (`gateway forward status`, the API) and
// listed (`gateway forward dead list`); once the cause is removed,
// `gateway forward dead replay` delivers them, in order, and the
// backlog drains.
func TestForwardRefusedProcess(t *testing.T) {
	run := refusedRun(t)
	for _, c := range []struct {
		name string
		dest func(*testing.T) refusedDest
	}{{"mosquitto mqtt5", refusedMosquitto}, {"redis", refusedRedis}, {"nats", refusedNATS}, {"kafka", refusedKafka}} {
		t.Run(c.name, func(t *testing.T) { refusedProcessRun(t, run, c.dest(t)) })
	}
}

func refusedMosquitto(t *testing.T) refusedDest {
	ids := fleetIDs(20)
	d := refusedDest{extra: `, mqtt_version: "5"`, reason: "not_authorized", errorText: "0x87", good: ids[1:], bad: ids[0],
		log: &upstreamLog{got: map[string][]int{}}}
	up := mosquittotest.StartWith(t, mosquittotest.Options{ACL: "topic readwrite #\ntopic deny devices/" + d.bad + "/t\n", MaxQueued: 1000000})
	d.to = "mqtt://" + up.Addr
	sub := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + up.Addr).SetClientID("backend").SetOrderMatters(true))
	if tok := sub.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("backend: %v", tok.Error())
	}
	t.Cleanup(func() { sub.Disconnect(0) })
	if tok := sub.Subscribe("devices/#", 1, func(_ mqtt.Client, m mqtt.Message) {
		if string(m.Payload()) != "probe" {
			d.log.add(m.Topic(), m.Payload())
		}
	}); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("backend subscribe: %v", tok.Error())
	}
	d.fix = func() {
		up.SetACL("topic readwrite #\n")
		// Mosquitto reads it again in the background: probe until a
		// publish of the topic is taken.
		probe := connect5(up.Addr, "probe")
		if probe == nil {
			t.Fatal("probe: no connection")
		}
		defer probe.Disconnect(&paho.Disconnect{})
		poll.Until(t, 10*time.Second, "the new ACL in force", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := probe.Publish(ctx, &paho.Publish{Topic: "devices/" + d.bad + "/t", QoS: 1, Payload: []byte("probe")})
			return err == nil
		})
	}
	return d
}

func refusedRedis(t *testing.T) refusedDest {
	ids := fleetIDs(20)
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	d := refusedDest{to: "redis://" + srv.Addr, extra: `, stream: "{topic}"`, reason: "wrong_type", errorText: "WRONGTYPE",
		good: ids[1:], bad: ids[0], log: &upstreamLog{}}
	if err := c.Set(ctx, "devices/"+d.bad+"/t", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	d.fix = func() { c.Del(ctx, "devices/"+d.bad+"/t") }
	d.refresh = func() {
		got := map[string][]int{}
		for _, id := range ids {
			topic := "devices/" + id + "/t"
			if typ, _ := c.Type(ctx, topic).Result(); typ != "stream" {
				continue
			}
			msgs, err := c.XRange(ctx, topic, "-", "+").Result()
			if err != nil {
				t.Fatalf("XRANGE %s: %v", topic, err)
			}
			for _, m := range msgs {
				got[topic] = append(got[topic], payloadNumber([]byte(m.Values["payload"].(string))))
			}
		}
		d.log.set(got)
	}
	return d
}

func refusedNATS(t *testing.T) refusedDest {
	ids := fleetIDs(20)
	srv := natstest.Start(t)
	ctx := context.Background()
	js := srv.JetStream()
	cfg := jetstream.StreamConfig{Name: "DEVICES", Subjects: []string{"devices.>"}, Storage: jetstream.FileStorage, MaxMsgSize: 1024}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	d := refusedDest{to: srv.URL, reason: "too_large", errorText: "message size exceeds maximum allowed", good: ids[1:], bad: ids[0],
		pad: 2000, log: &upstreamLog{got: map[string][]int{}}}
	d.fix = func() {
		cfg.MaxMsgSize = -1
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	var cons jetstream.Consumer
	d.refresh = func() {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if cons == nil {
			var err error
			if cons, err = js.OrderedConsumer(ctx, "DEVICES", jetstream.OrderedConsumerConfig{}); err != nil {
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

func refusedKafka(t *testing.T) refusedDest {
	k := kafkatest.Start(t, 3, []string{"telemetry"})
	k.SetTopicConfig("telemetry", "max.message.bytes", "4096")
	// Kafka refuses a whole batch of a partition that is too large: the
	// good devices are those whose records go to other partitions than
	// the bad one's (docs/forwarding-failures.md).
	partition := func(id string) int {
		return kgo.StickyKeyPartitioner(nil).ForTopic("telemetry").Partition(&kgo.Record{Key: []byte(id)}, 3)
	}
	d := refusedDest{to: "kafka://" + k.Addr, extra: `, kafka_topic: telemetry`, reason: "too_large", errorText: "MESSAGE_TOO_LARGE",
		bad: "dev-00", pad: 8000, log: &upstreamLog{}}
	for i := 1; len(d.good) < 19; i++ {
		if id := fmt.Sprintf("dev-%02d", i); partition(id) != partition(d.bad) {
			d.good = append(d.good, id)
		}
	}
	d.fix = func() { k.SetTopicConfig("telemetry", "max.message.bytes", "1048588") }
	d.refresh = func() {
		got := map[string][]int{}
		for _, r := range k.Records("telemetry") {
			got["devices/"+string(r.Key)+"/t"] = append(got["devices/"+string(r.Key)+"/t"], payloadNumber(r.Value))
		}
		d.log.set(got)
	}
	return d
}

func refusedProcessRun(t *testing.T, run time.Duration, d refusedDest) {
	refresh := func() {
		if d.refresh != nil {
			d.refresh()
		}
	}
	conf := writeConfig(t, fmt.Sprintf("forward: [{name: cloud, to: %q, topics: [\"devices/#\"]%s}]\n", d.to, d.extra))
	g := startGW(t, t.TempDir(), "--config", conf, "--limit", "100000", "--window", "1s")
	upstream := func() map[string]any {
		_, v := g.call(t, "GET", "/api/v1/forward", "")
		return v["upstreams"].([]any)[0].(map[string]any)
	}
	ids := append([]string{d.bad}, d.good...)
	payload := func(id string, n int) []byte {
		p := []byte(strconv.Itoa(n))
		if id == d.bad && d.pad > 0 {
			// Random bytes: a producer may compress its batches.
			pad := make([]byte, d.pad)
			rand.Read(pad)
			p = append(append(p, ':'), pad...)
		}
		return p
	}
	f := startFleetOf(g.mqtt, ids, 20*time.Millisecond, payload)
	time.Sleep(run) // the run's length is the test's subject
	acked := f.halt()
	badTopic := "devices/" + d.bad + "/t"
	bad := acked[badTopic]
	delete(acked, badTopic)
	total := 0
	for _, n := range acked {
		total += n
	}
	poll.Until(t, 60*time.Second, "the backlog gone through", func() bool { return upstream()["backlog_messages"].(float64) == 0 })
	// arrived waits until every message acked counts is at the
	// destination, then checks that each came once, in order.
	arrived := func(what string) {
		t.Helper()
		var missing, dups int
		var order string
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) { // polling the destination
			refresh()
			if missing, order, dups = d.log.check(acked); missing == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d acknowledged messages never arrived: %s", what, missing, d.log.missingSample(acked))
			}
		}
		if order != "" || dups > 0 {
			t.Fatalf("%s: %d duplicates, order %q", what, dups, order)
		}
	}
	arrived("the other devices")
	d.log.mu.Lock()
	early := len(d.log.got[badTopic])
	d.log.mu.Unlock()
	if bad == 0 || early != 0 {
		t.Fatalf("%s: %d acknowledged, %d arrived; want some, none arrived", d.bad, bad, early)
	}
	up := upstream()
	if up["dead_letters"].(float64) != float64(bad) || up["connected"].(float64) != 1 {
		t.Fatalf("GET /api/v1/forward: %v; want %d dead letters, connected", up, bad)
	}
	samples, _ := g.scrape(t)
	if n := samples[fmt.Sprintf(`devicegate_forward_dead_letters_total{reason=%q,upstream="cloud"}`, d.reason)]; n != float64(bad) {
		t.Fatalf("devicegate_forward_dead_letters_total{reason=%q} = %v, want %d", d.reason, n, bad)
	}
	admin := []string{"--admin-addr", g.admin, "--token", g.token}
	code, out, errOut := runBinary(t, append([]string{"forward", "status"}, admin...)...)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("%s %d", d.reason, bad)) {
		t.Fatalf("forward status: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runBinary(t, append([]string{"forward", "dead", "list", "cloud", "--limit", "3"}, admin...)...)
	if code != 0 || !strings.Contains(out, d.errorText) || !strings.Contains(out, d.bad) || !strings.Contains(out, fmt.Sprintf("3 of %d shown", bad)) {
		t.Fatalf("forward dead list: exit %d\n%s%s", code, out, errOut)
	}

	d.fix()
	// Two replays at once: between them, each dead letter is sent once
	// (before, both sent every one: each arrived twice, under two IDs).
	replays := make([]string, 2)
	var wg sync.WaitGroup
	for i := range replays {
		wg.Go(func() {
			code, out, errOut := runBinary(t, append([]string{"forward", "dead", "replay", "cloud"}, admin...)...)
			if code != 0 {
				out = fmt.Sprintf("exit %d: %s%s", code, out, errOut)
			}
			replays[i] = out
		})
	}
	wg.Wait()
	var n1, n2 int
	if _, err := fmt.Sscanf(replays[0], "cloud: %d dead letters sent again", &n1); err != nil {
		t.Fatalf("forward dead replay: %q", replays[0])
	}
	if _, err := fmt.Sscanf(replays[1], "cloud: %d dead letters sent again", &n2); err != nil || n1+n2 != bad {
		t.Fatalf("two forward dead replays at once: %q and %q; want %d in all", replays[0], replays[1], bad)
	}
	acked[badTopic] = bad
	arrived("after the replay")
	poll.Until(t, 30*time.Second, "the backlog drained", func() bool {
		u := upstream()
		return u["backlog_messages"].(float64) == 0 && u["dead_letters"].(float64) == 0
	})
	g.stop()
	t.Logf("%s: 20 devices for %s: %d messages of 19 devices each once, in order; %s's %d refused (%s), dead letters, replayed in order once the cause was removed",
		d.to, run, total, d.bad, bad, d.reason)
}
