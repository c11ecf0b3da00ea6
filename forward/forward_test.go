package forward

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicegate/internal/mosquittotest"
	"devicegate/internal/poll"
	"devicegate/persist"
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
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("upstream-sub").
		SetCleanSession(true).SetAutoReconnect(true).SetOrderMatters(true))
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

func newForwarder(t *testing.T, addr string) (*Forwarder, *persist.Store) {
	t.Helper()
	return runForwarder(t, Config{Name: "up/0", Addr: addr, ClientID: "gw-test-0", LocalPrefix: "devices/", RemotePrefix: "site-7/devices/",
		MaxQoS: 1, Window: 16, AckTimeout: 500 * time.Millisecond, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
}

// runForwarder runs a forwarder of cfg over a fresh store until the test
// ends.
func runForwarder(t *testing.T, cfg Config) (*Forwarder, *persist.Store) {
	t.Helper()
	st, err := persist.Open(t.TempDir(), persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f, err := New(cfg, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return f, st
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
	up := mosquittotest.Start(t)
	sub := subscribe(t, up.Addr, "site-7/#")
	f, st := newForwarder(t, up.Addr)
	const n = 300
	for i := 1; i <= n; i++ {
		if err := f.Append("devices/dev-1/t", 1, false, []byte(strconv.Itoa(i))); err != nil {
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
	if st := f.Stats(); st.Forwarded != n || st.Backlog != 0 || st.BacklogBytes != 0 || !st.Connected {
		t.Fatalf("stats %+v, want %d forwarded and nothing left", st, n)
	}
}

// TestForwardThroughOutage: the upstream stops answering (its process
// paused) while messages keep coming; the forwarder notices, keeps them
// in the log, reconnects when the upstream is back and delivers every
// one, the first arrivals in order (duplicates only from the window in
// flight).
func TestForwardThroughOutage(t *testing.T) {
	up := mosquittotest.Start(t)
	sub := subscribe(t, up.Addr, "site-7/#")
	f, st := newForwarder(t, up.Addr)
	for i := 1; i <= 100; i++ {
		if err := f.Append("devices/dev-1/t", 1, false, []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, 20*time.Second, "the first 100 upstream", func() bool { return sub.firsts(t) == 100 })
	up.Pause()
	for i := 101; i <= 200; i++ {
		if err := f.Append("devices/dev-1/t", 1, false, []byte(strconv.Itoa(i))); err != nil {
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
}

// TestRecordRoundTrip: a forward record keeps topic, QoS, retain and
// payload; a damaged one is refused.
func TestRecordRoundTrip(t *testing.T) {
	for _, c := range []struct {
		topic   string
		qos     byte
		retain  bool
		payload string
	}{{"a/b", 1, true, "x"}, {"", 0, false, ""}, {"t", 2, false, string(make([]byte, 300))}} {
		topic, qos, retain, payload, err := decodeRecord(appendRecord(nil, c.topic, c.qos, c.retain, []byte(c.payload)))
		if err != nil || topic != c.topic || qos != c.qos || retain != c.retain || string(payload) != c.payload {
			t.Fatalf("%+v: got %q %d %v %q %v", c, topic, qos, retain, payload, err)
		}
	}
	for _, bad := range [][]byte{nil, {2, 0, 0}, {1, 0, 9, 'a'}} {
		if _, _, _, _, err := decodeRecord(bad); err == nil {
			t.Errorf("decodeRecord(% x) accepted", bad)
		}
	}
}
