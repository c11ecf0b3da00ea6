package forward

import (
	"context"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/poll"
	"github.com/devicegate/devicegate/persist"
)

// upstreamSub subscribes to filter on the upstream broker at QoS 1 and
// records the payloads that arrive, in order.
type upstreamSub struct {
	mu     sync.Mutex
	got    []string
	topics map[string]bool
}

func subscribe(t *testing.T, addr, filter string) *upstreamSub {
	t.Helper()
	s := &upstreamSub{topics: map[string]bool{}}
	// A persistent session: across a restart of a broker that persists,
	// the subscription stays and what arrived meanwhile is queued.
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("upstream-sub-" + strings.NewReplacer("/", "", "#", "", "+", "").Replace(filter)).
		SetCleanSession(false).SetAutoReconnect(true).SetMaxReconnectInterval(100 * time.Millisecond).SetOrderMatters(true))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscriber connect: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(0) })
	tok := c.Subscribe(filter, 1, func(_ mqtt.Client, m mqtt.Message) {
		s.mu.Lock()
		s.got = append(s.got, string(m.Payload()))
		s.topics[m.Topic()] = true
		s.mu.Unlock()
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	return s
}

// firsts returns how many distinct payloads arrived and fails unless
// their first arrivals are in increasing order (duplicates allowed).
func (s *upstreamSub) firsts(t *testing.T) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]bool{}
	prev := 0
	for _, p := range s.got {
		if seen[p] {
			continue
		}
		seen[p] = true
		n, _ := strconv.Atoi(p)
		if n < prev {
			t.Fatalf("message %d arrived first after %d: out of order", n, prev)
		}
		prev = n
	}
	return len(seen)
}

func newForwarder(t *testing.T, addr string, v5 bool) (*Forwarder, *persist.Store) {
	t.Helper()
	return runForwarder(t, Config{Name: "up/0", Dial: &MQTT{Address: addr, ClientID: "gw-test-0", V5: v5}, Map: Map{Local: "devices/", Remote: "site-7/devices/"},
		MaxQoS: 1, Window: 16, AckTimeout: 500 * time.Millisecond, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
}

// runForwarder runs a forwarder of cfg over a fresh store until the test
// ends.
func runForwarder(t *testing.T, cfg Config) (*Forwarder, *persist.Store) {
	t.Helper()
	return runForwarderLog(t, cfg, nil)
}

// runForwarderLog is runForwarder logging to logger.
func runForwarderLog(t *testing.T, cfg Config, logger *slog.Logger) (*Forwarder, *persist.Store) {
	t.Helper()
	st, err := persist.Open(t.TempDir(), persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return startForwarder(t, cfg, st, logger), st
}

// startForwarder runs a forwarder of cfg on st until the test ends.
func startForwarder(t *testing.T, cfg Config, st Log, logger *slog.Logger) *Forwarder {
	t.Helper()
	f, err := New(cfg, st, logger)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

func logLen(t *testing.T, st *persist.Store) int {
	n, _, _, _, err := st.ForwardStats("up/0")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestForwardInOrder: appended messages reach a real Mosquitto under the
// remote prefix, in order, and leave the log once acknowledged.
func TestForwardInOrder(t *testing.T) {
	for _, v5 := range []bool{false, true} {
		t.Run(protocol(v5), func(t *testing.T) {
			up := mosquittotest.Start(t)
			sub := subscribe(t, up.Addr, "site-7/#")
			f, st := newForwarder(t, up.Addr, v5)
			const n = 300
			for i := 1; i <= n; i++ {
				if err := f.Append(msg("devices/dev-1/t", strconv.Itoa(i))); err != nil {
					t.Fatal(err)
				}
			}
			// The counters follow the deletion: wait for them too.
			poll.Until(t, 20*time.Second, "every message upstream", func() bool {
				return sub.firsts(t) == n && logLen(t, st) == 0 && f.Stats().Forwarded == n
			})
			if !sub.topics["site-7/devices/dev-1/t"] || len(sub.topics) != 1 {
				t.Fatalf("upstream topics %v, want the remote prefix", sub.topics)
			}
			if st := f.Stats(); st.Forwarded != n || st.Backlog != 0 || st.BacklogBytes != 0 || st.Connected != 1 || st.LastError != "" {
				t.Fatalf("stats %+v, want %d forwarded and nothing left", st, n)
			}
		})
	}
}

// TestForwardThroughOutage: the upstream stops answering (its process
// paused) while messages keep coming; the forwarder notices, keeps them
// in the log, reconnects when the upstream is back and delivers every
// one, the first arrivals in order (duplicates only from the window in
// flight).
func TestForwardThroughOutage(t *testing.T) {
	for _, v5 := range []bool{false, true} {
		t.Run(protocol(v5), func(t *testing.T) {
			up := mosquittotest.Start(t)
			sub := subscribe(t, up.Addr, "site-7/#")
			f, st := newForwarder(t, up.Addr, v5)
			for i := 1; i <= 100; i++ {
				if err := f.Append(msg("devices/dev-1/t", strconv.Itoa(i))); err != nil {
					t.Fatal(err)
				}
			}
			poll.Until(t, 20*time.Second, "the first 100 upstream", func() bool { return sub.firsts(t) == 100 })
			up.Pause()
			for i := 101; i <= 200; i++ {
				if err := f.Append(msg("devices/dev-1/t", strconv.Itoa(i))); err != nil {
					t.Fatal(err) // appends never wait for the upstream
				}
			}
			poll.Until(t, 20*time.Second, "the forwarder to notice the outage", func() bool { return !f.Connected() })
			if n := logLen(t, st); n == 0 || f.Stats().Backlog != int64(n) {
				t.Fatalf("during the outage: log %d, stats %+v", n, f.Stats())
			}
			up.Resume()
			poll.Until(t, 20*time.Second, "every message upstream after the outage", func() bool { return sub.firsts(t) == 200 && logLen(t, st) == 0 })
			sub.mu.Lock()
			dups := len(sub.got) - 200
			sub.mu.Unlock()
			if dups > 16+16 {
				t.Fatalf("%d duplicates, more than the window in flight", dups)
			}
			t.Logf("200 messages through the outage, %d duplicates", dups)
		})
	}
}

// TestRecordRoundTrip: a forward record keeps every field of a message,
// properties included; a record of version 1 (no device, time or
// properties) still reads; a damaged one is refused.
func TestRecordRoundTrip(t *testing.T) {
	at := time.UnixMilli(1_790_000_000_123)
	for _, m := range []Message{
		{Device: "dev-1", At: at, Topic: "a/b", QoS: 1, Retain: true, Payload: []byte("x")},
		{Topic: "", Payload: []byte{}},
		{Device: "d", At: at, Topic: "t", QoS: 2, Payload: make([]byte, 300), Props: &Props{
			PayloadFormat: 1, HasPayloadFormat: true, MessageExpiry: 60, ContentType: "application/json", ResponseTopic: "r/1",
			CorrelationData: []byte{0, 1}, User: []UserProperty{{"k", "v"}, {"k", "w"}}}},
		{Device: "d", At: at, Topic: "t", Props: &Props{}, Payload: []byte("p")},
	} {
		got, err := decodeRecord(appendRecord(nil, &m))
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("%+v: got %+v, %v", m, got, err)
		}
	}
	v1, err := decodeRecord([]byte{1, 1 | 4, 3, 'a', '/', 'b', 'h', 'i'})
	if err != nil || v1.Topic != "a/b" || v1.QoS != 1 || !v1.Retain || string(v1.Payload) != "hi" || !v1.At.IsZero() || v1.Device != "" {
		t.Fatalf("version 1 record: %+v, %v", v1, err)
	}
	full := appendRecord(nil, &Message{Device: "d", At: at, Topic: "t", Props: &Props{User: []UserProperty{{"k", "v"}}}, Payload: []byte("p")})
	for _, bad := range [][]byte{nil, {3, 0, 0}, {1, 0, 9, 'a'}, {2, 0, 0x80}, full[:len(full)-5]} {
		if _, err := decodeRecord(bad); err == nil {
			t.Errorf("decodeRecord(% x) accepted", bad)
		}
	}
}

// FuzzRecord: any bytes decode to a message or an error, never a panic;
// a message that decodes encodes to a record that decodes the same.
func FuzzRecord(f *testing.F) {
	f.Add(appendRecord(nil, &Message{Device: "d", At: time.UnixMilli(5), Topic: "t", Props: &Props{User: []UserProperty{{"k", "v"}}}, Payload: []byte("p")}))
	f.Add([]byte{1, 1, 1, 'a', 'b'})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeRecord(b)
		if err != nil {
			return
		}
		again, err := decodeRecord(appendRecord(nil, &m))
		if err != nil || !reflect.DeepEqual(again, m) {
			t.Fatalf("% x: %+v then %+v, %v", b, m, again, err)
		}
	})
}

// protocol names an upstream protocol in subtests.
func protocol(v5 bool) string {
	if v5 {
		return "mqtt5"
	}
	return "mqtt3.1.1"
}

// msg is a QoS 1 message of device dev-1.
func msg(topic, payload string) *Message {
	return &Message{Device: "dev-1", Topic: topic, QoS: 1, Payload: []byte(payload)}
}
