package broker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/persist"
)

// A persist.Store is the broker's DeferStore, with no adapter.
var _ DeferStore = (*persist.Store)(nil)

// persistDefer is a real store, as the tests hold it.
type persistDefer struct{ *persist.Store }

// openStore opens a real store (a bbolt file) in dir, closed when the
// test ends (after the servers, which close first: cleanups run last in,
// first out).
func openStore(t *testing.T, dir string) persistDefer {
	t.Helper()
	s, err := persist.Open(dir, persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return persistDefer{s}
}

// deferSome starts a server on the store in dir, publishes
// payloads("m", n) as dev-1 on t/a (under rules, the first n the window
// admits go through and the rest are deferred), and closes the server,
// not the store.
func deferSome(t *testing.T, dir string, clock *devicelimit.ManualClock, rules []devicelimit.Rule, n int) (*fixture, persistDefer) {
	t.Helper()
	s := openStore(t, dir)
	f := start(t, fixtureOpts{rules: rules, store: s, clock: clock})
	p := f.connect(t, 5, "dev-1", "")
	for _, m := range payloads("m", n) {
		if code := publish5(t, p, &paho.Publish{Topic: "t/a", QoS: 1, Payload: []byte(m)}); code != 0 {
			t.Fatalf("publish %s: 0x%02x", m, code)
		}
	}
	closeNow(t, f.srv)
	return f, s
}

// stored is one message read back from a store.
type stored struct {
	device string
	seq    uint64
	msg    deferredMsg
}

// storedMsgs reads the store's deferred messages, in its order.
func storedMsgs(t *testing.T, s DeferStore) []stored {
	t.Helper()
	var out []stored
	err := s.LoadDeferred(func(device string, seq uint64, rec []byte) error {
		if err := checkDeferred(rec, device, seq); err != nil {
			return err
		}
		m, err := decodeDeferred(deferredBody(rec))
		if err != nil {
			return err
		}
		out = append(out, stored{device, seq, m})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// received is a message as a subscriber got it, and the logical instant
// it arrived at.
type received struct {
	pub *paho.Publish
	at  devicelimit.Tick
}

// msgSink records the messages an MQTT 5 subscriber receives, in order,
// with the manual clock's reading on arrival.
type msgSink struct {
	clock devicelimit.Clock
	mu    sync.Mutex
	got   []received
}

func (s *msgSink) all() []received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]received(nil), s.got...)
}

func (s *msgSink) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}

func (s *msgSink) payloads() []string {
	var out []string
	for _, r := range s.all() {
		out = append(out, string(r.pub.Payload))
	}
	return out
}

// subscribeMsgs subscribes an MQTT 5 client to filter at QoS 2, with
// retain-as-published so a live message's retain flag shows.
func (f *fixture) subscribeMsgs(t *testing.T, id, filter string) *msgSink {
	t.Helper()
	s := &msgSink{clock: f.clock}
	c := f.dial5(t, id, "", func(p *paho.Publish) {
		s.mu.Lock()
		s.got = append(s.got, received{p, s.clock.Now()})
		s.mu.Unlock()
	})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{
		{Topic: filter, QoS: 2, RetainAsPublished: true}}}); err != nil {
		t.Fatalf("subscribe %s: %v", filter, err)
	}
	return s
}

// waitLen waits until the sink holds n messages, and checks that no more
// come with them.
func (s *msgSink) waitLen(t *testing.T, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d messages", n), func() bool { return s.len() >= n })
	if got := s.len(); got != n {
		t.Fatalf("subscriber got %d messages, want %d: %q", got, n, s.payloads())
	}
}

// releaseStep advances the clock by step, runs a release round and waits
// until the subscriber has every message forwarded so far: want directly
// forwarded ones plus those released. Released messages are in the
// subscriber's outbound queue when releaseTick returns, so they arrive
// stamped with this step's instant.
func (f *fixture) releaseStep(t *testing.T, sink *msgSink, direct int, step time.Duration) devicelimit.Tick {
	t.Helper()
	now := f.clock.Advance(step)
	f.srv.releaseTick(now)
	want := direct + int(f.srv.Stats().Released)
	eventually(t, fmt.Sprintf("%d messages after the round at %s", want, now), func() bool { return sink.len() >= want })
	return now
}

// releaseAll runs release steps until the queue is empty, at most
// maxSteps.
func (f *fixture) releaseAll(t *testing.T, sink *msgSink, direct int, step time.Duration, maxSteps int) {
	t.Helper()
	for i := 0; f.srv.Stats().QueueMessages > 0; i++ {
		if i == maxSteps {
			t.Fatalf("queue not empty after %d steps of %s: %+v", maxSteps, step, f.srv.Stats())
		}
		f.releaseStep(t, sink, direct, step)
	}
}

// publish5 publishes p from an MQTT 5 publisher and returns the reason
// code of its ack.
func publish5(t *testing.T, p publisher, pub *paho.Publish) byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	resp, err := p.(*pub5).c.Publish(ctx, pub)
	if resp == nil {
		t.Fatalf("publish %q: %v", pub.Payload, err)
	}
	return resp.ReasonCode
}

// maxInWindow returns the most arrivals in any interval [a, a+window).
func maxInWindow(ticks []devicelimit.Tick, window time.Duration) int {
	best := 0
	for i := range ticks {
		n := 0
		for j := i; j < len(ticks) && ticks[j] < ticks[i].Add(window); j++ {
			n++
		}
		best = max(best, n)
	}
	return best
}

func deferRule(pattern string, limit int, window time.Duration) devicelimit.Rule {
	return devicelimit.Rule{Name: pattern, ClientID: pattern,
		Quota: devicelimit.Quota{Limit: limit, Window: window, Policy: devicelimit.PolicyDefer}}
}
