package server

import (
	"bufio"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	packets311 "github.com/eclipse/paho.mqtt.golang/packets"

	"github.com/devicegate/devicegate/internal/mqtttest"
)

// TestConsumersKeepUp is the promise of docs/operations.md (Sizing) for
// subscribers at the defaults: 50 devices publish 5,000 messages of 2 KiB while two
// subscribers of devices/# read nothing, then both read. The backend
// consumer (mqtt.consumers.client_ids) gets every message; the other
// subscriber, at the default queue of 64 messages, gets what its socket
// and queue held, and every message it missed is counted in
// devicegate_slow_subscriber_drops_total.
func TestConsumersKeepUp(t *testing.T) {
	const devices, each = 50, 100
	cfg := testConfig(t.TempDir(), 1000, time.Minute)
	cfg.MQTT.Consumers.ClientIDs = []string{"backend-*"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := mustStart(t, cfg, Deps{})
	addr, metrics := g.Addr().String(), "http://"+g.AdminAddr().String()+"/metrics"

	// Raw MQTT 3.1.1 subscribers: they read nothing until counted.
	consumer := rawSubscriber(t, addr, "backend-1", "devices/#")
	watcher := rawSubscriber(t, addr, "watcher", "devices/#")

	payload := string(make([]byte, 2048))
	var wg sync.WaitGroup
	for d := range devices {
		id := fmt.Sprintf("meter-%d", d)
		dev := mqtttest.Dial5(t, addr, id)
		wg.Go(func() {
			for range each {
				dev.MustPublish(t, "devices/"+id+"/t", payload, mqtttest.CodeSuccess)
			}
		})
	}
	wg.Wait()
	if spooled := metric(t, metrics, "devicegate_consumer_spool_bytes"); spooled == 0 {
		t.Fatal("nothing held for the stalled consumer after 10 MiB")
	}
	const sent = devices * each
	t.Logf("before reading: drops %v waits %v spool %v", metric(t, metrics, "devicegate_slow_subscriber_drops_total"), metric(t, metrics, "devicegate_consumer_waits_total"), metric(t, metrics, "devicegate_consumer_spool_bytes"))
	consumerGot := countPublishes(t, consumer, func(n int) bool { return n == sent })
	if consumerGot != sent {
		t.Fatalf("the consumer got %d of %d", consumerGot, sent)
	}
	drops := int(metric(t, metrics, "devicegate_slow_subscriber_drops_total"))
	t.Logf("drops %d", drops)
	watcherGot := countPublishes(t, watcher, func(n int) bool { return n+drops == sent })
	if watcherGot == sent || drops == 0 {
		t.Fatal("the watcher missed nothing: 10 MiB fit its socket and 64 queued messages?")
	}
	t.Logf("consumer %d of %d; watcher %d, %d counted as drops; %v publishes waited for the consumer", consumerGot, sent,
		watcherGot, drops, metric(t, metrics, "devicegate_consumer_waits_total"))
}

// rawSubscriber connects id over MQTT 3.1.1 and subscribes it to filter
// at QoS 0; it then reads only when the test does.
func rawSubscriber(t *testing.T, addr, id, filter string) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	c := packets311.NewControlPacket(packets311.Connect).(*packets311.ConnectPacket)
	c.ProtocolName, c.ProtocolVersion, c.CleanSession, c.ClientIdentifier = "MQTT", 4, true, id
	s := packets311.NewControlPacket(packets311.Subscribe).(*packets311.SubscribePacket)
	s.MessageID, s.Topics, s.Qoss = 1, []string{filter}, []byte{0}
	for _, p := range []packets311.ControlPacket{c, s} {
		if err := p.Write(conn); err != nil {
			t.Fatal(err)
		}
		if _, err := packets311.ReadPacket(conn); err != nil { // CONNACK, SUBACK
			t.Fatal(err)
		}
	}
	return conn
}

// countPublishes reads PUBLISH packets from conn until enough(count)
// holds, and returns the count.
func countPublishes(t *testing.T, conn net.Conn, enough func(int) bool) int {
	t.Helper()
	r := bufio.NewReaderSize(conn, 64<<10)
	n := 0
	for !enough(n) {
		p, err := packets311.ReadPacket(r)
		if err != nil {
			t.Fatalf("after %d messages: %v", n, err)
		}
		if _, ok := p.(*packets311.PublishPacket); ok {
			n++
		}
	}
	return n
}

// metric reads one series from the gateway's /metrics: name, with its
// labels if it has any (`x_total{result="ok"}`).
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(httpGet(t, url, ""))
	if m == nil {
		t.Fatalf("/metrics has no %s", name)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
