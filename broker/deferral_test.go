package broker

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/logtest"
)

// A device with quota 5 per second under policy defer sends 50 QoS 1
// messages at once: every one is acked 0x00 (after it is stored), and
// the subscriber receives all 50, in order, released as the window
// admits them: never more than 5 in any second of logical time, the last
// about 10 s after the burst.
func TestDeferSmoothsBurst(t *testing.T) {
	const n, limit = 50, 5
	for _, version := range []int{3, 5} {
		t.Run(fmt.Sprintf("mqtt%d", version), func(t *testing.T) {
			t.Parallel()
			store := openStore(t, t.TempDir())
			f := start(t, fixtureOpts{rules: []devicelimit.Rule{deferRule("dev-*", limit, time.Second)}, store: store})
			sub := f.subscribeMsgs(t, "sub", "t/#")
			p := f.connect(t, version, "dev-1", "")
			want := payloads("m", n)
			if version == 3 {
				// All 50 in flight at once; paho.mqtt.golang keeps their order.
				var toks []interface{ WaitTimeout(time.Duration) bool }
				for _, m := range want {
					toks = append(toks, p.(*pub3).c.Publish("t/dev-1", 1, false, m))
				}
				for i, tok := range toks {
					if !tok.WaitTimeout(waitTimeout) {
						t.Fatalf("publish %d: no PUBACK", i)
					}
				}
			} else {
				for _, m := range want {
					if code := publish5(t, p, &paho.Publish{Topic: "t/dev-1", QoS: 1, Payload: []byte(m)}); code != 0 {
						t.Fatalf("publish %s: PUBACK 0x%02x, want 0x00", m, code)
					}
				}
			}
			st := f.srv.Stats()
			if st.Allowed != limit || st.Deferred != n-limit || st.QueueMessages != n-limit || st.QueueBytes <= 0 {
				t.Fatalf("after the burst: %+v, want %d allowed, %d deferred and queued", st, limit, n-limit)
			}
			// Every acked message is in the store.
			if got := len(storedMsgs(t, store)); got != n-limit {
				t.Fatalf("%d messages stored, want %d", got, n-limit)
			}
			sub.waitLen(t, limit)

			f.releaseAll(t, sub, limit, 50*time.Millisecond, 400)
			sub.waitLen(t, n)
			if got := sub.payloads(); !equal(got, want) {
				t.Fatalf("received %q, want %q", got, want)
			}
			var ticks []devicelimit.Tick
			for _, r := range sub.all() {
				ticks = append(ticks, r.at)
			}
			if m := maxInWindow(ticks, time.Second); m > limit {
				t.Fatalf("%d messages within one second, want at most %d (arrivals %v)", m, limit, ticks)
			}
			last := ticks[n-1].Sub(t0)
			if last < 9*time.Second || last > 10500*time.Millisecond {
				t.Fatalf("last message released %s after the burst, want about 10s (45 messages at 5/s)", last)
			}
			st = f.srv.Stats()
			if st.Released != n-limit || st.Expired != 0 || st.Overflowed != 0 || st.QueueMessages != 0 || st.QueueBytes != 0 || st.Inline != 0 {
				t.Fatalf("after the release: %+v", st)
			}
			f.srv.def.flushDeletes()
			if left := storedMsgs(t, store); len(left) != 0 {
				t.Fatalf("%d released messages still stored", len(left))
			}
		})
	}
}

// While a device has messages queued, a new message queues behind them
// even when the window has room, and is released after them.
func TestDeferQueuesBehind(t *testing.T) {
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{deferRule("dev-*", 2, time.Second)}, store: openStore(t, t.TempDir())})
	sub := f.subscribeMsgs(t, "sub", "t/#")
	p := f.connect(t, 5, "dev-1", "")
	for _, m := range []string{"m0", "m1", "m2"} {
		if code := publish5(t, p, &paho.Publish{Topic: "t/a", QoS: 1, Payload: []byte(m)}); code != 0 {
			t.Fatalf("publish %s: 0x%02x", m, code)
		}
	}
	f.clock.Advance(2 * time.Second) // the window is empty again; m2 not yet released
	if code := publish5(t, p, &paho.Publish{Topic: "t/a", QoS: 1, Payload: []byte("m3")}); code != 0 {
		t.Fatalf("publish m3: 0x%02x", code)
	}
	if st := f.srv.Stats(); st.Allowed != 2 || st.Deferred != 2 {
		t.Fatalf("stats %+v, want m0, m1 allowed and m2, m3 deferred", st)
	}
	if w := f.table.PeekAt("dev-1", devicelimit.Quota{Limit: 2, Window: time.Second}, f.clock.Now()); w.Count != 0 {
		t.Fatalf("window count %d: m3 was counted, not queued", w.Count)
	}
	sub.waitLen(t, 2)
	f.srv.releaseTick(f.clock.Now())
	sub.waitLen(t, 4)
	if got := sub.payloads(); !equal(got, []string{"m0", "m1", "m2", "m3"}) {
		t.Fatalf("received %q", got)
	}
}

// A message published while a release round is publishing the device's
// queue (the queue is empty once the round ends, and the window has
// room) still goes behind the messages being released.
func TestDeferQueuesBehindRelease(t *testing.T) {
	s, cl, pk := newHookServer(t, devicelimit.Quota{Limit: 10, Window: time.Second, Policy: devicelimit.PolicyDefer},
		openStore(t, t.TempDir()))
	clock := s.opts.Clock.(*devicelimit.ManualClock)
	for range 10 {
		if _, err := s.hook.OnPublish(cl, pk); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.hook.OnPublish(cl, pk); err != errIgnore { // the 11th: deferred
		t.Fatalf("11th publish: %v, want CodeSuccessIgnore", err)
	}
	clock.Advance(2 * time.Second)

	inPublish, proceed := make(chan struct{}), make(chan struct{})
	var released []string
	s.def.publish = func(device string, m *deferredMsg, _ uint32) error {
		released = append(released, string(m.Payload))
		if len(released) == 1 {
			close(inPublish)
			<-proceed
		}
		return nil
	}
	done := make(chan struct{})
	go func() { defer close(done); s.def.releaseTick(clock.Now()) }()
	<-inPublish
	// The window has room (the message being released is its only
	// count), but the queue is not empty until the release is done.
	pk.Payload = []byte("during")
	if _, err := s.hook.OnPublish(cl, pk); err != errIgnore {
		t.Fatalf("publish during the release: %v, want it deferred behind the message being released", err)
	}
	close(proceed)
	<-done
	// It was due at once: the same round released it, second.
	if !slices.Equal(released, []string{"21.5", "during"}) {
		t.Fatalf("released %q, want the queued message, then the one published during its release", released)
	}
	if st := s.Stats(); st.Deferred != 2 || st.Released != 2 || st.Allowed != 10 || st.QueueMessages != 0 {
		t.Fatalf("stats %+v, want 10 allowed, 2 deferred, 2 released", st)
	}
}

// The deferral queue full: MQTT 5 QoS 1 gets PUBACK 0x97, QoS 2 PUBREC
// 0x97, with a reason; MQTT 3.1.1 0x00; QoS 0 nothing. Either way the
// message is not forwarded, and it is counted as overflowed.
func TestDeferQueueFull(t *testing.T) {
	const limit, queue = 2, 3
	for _, version := range []int{3, 5} {
		for _, qos := range []byte{0, 1, 2} {
			t.Run(fmt.Sprintf("mqtt%d/qos%d", version, qos), func(t *testing.T) {
				t.Parallel()
				f := start(t, fixtureOpts{rules: []devicelimit.Rule{deferRule("dev-*", limit, time.Second)},
					store: openStore(t, t.TempDir()), limits: DeferLimits{MaxMessagesPerDevice: queue}})
				sub := f.subscribeMsgs(t, "sub", "t/#")
				p := f.connect(t, version, "dev-1", "")
				want := payloads("ok", limit+queue)
				for _, m := range want {
					if a, err := p.publish(t, "t/dev-1", m, qos); err != nil || a.code != 0 {
						t.Fatalf("publish %s: 0x%02x %v", m, a.code, err)
					}
				}
				for _, m := range payloads("full", 4) {
					a, err := p.publish(t, "t/dev-1", m, qos)
					if err != nil {
						t.Fatalf("publish %s: %v (the client must keep working)", m, err)
					}
					wantCode := byte(0)
					if version == 5 && qos > 0 {
						wantCode = 0x97
					}
					if a.code != wantCode {
						t.Fatalf("publish %s: 0x%02x, want 0x%02x", m, a.code, wantCode)
					}
					if wantCode != 0 && a.reason != "quota exceeded: 2 messages per 1s, deferral queue full" {
						t.Fatalf("reason %q", a.reason)
					}
				}
				eventually(t, "all decided", func() bool {
					st := f.srv.Stats()
					return st.Allowed+st.Deferred+st.Overflowed == limit+queue+4
				})
				if st := f.srv.Stats(); st.Deferred != queue || st.Overflowed != 4 || st.Dropped != 0 {
					t.Fatalf("stats %+v, want %d deferred, 4 overflowed", st, queue)
				}
				f.releaseAll(t, sub, limit, 100*time.Millisecond, 100)
				sub.waitLen(t, limit+queue)
				if got := sub.payloads(); !equal(got, want) {
					t.Fatalf("received %q, want %q", got, want)
				}
			})
		}
	}
}

// The byte budgets, per device and in total, refuse what would exceed
// them. The total counts what each queued message holds in memory beside
// its record (queuedMsgSize): room for two records and one message's
// memory takes one message, not two.
func TestDeferByteLimits(t *testing.T) {
	payload := strings.Repeat("x", 100)
	recSize := int64(len(deferredRecord(&deferredMsg{Enqueued: t0, Quota: deferRule("", 1, time.Second).Quota,
		Version: 5, QoS: 1, Topic: "t/a", Payload: []byte(payload)})))
	for _, tc := range []struct {
		name   string
		limits DeferLimits
		want   []byte // ack codes of dev-1's four publishes, then dev-2's two
	}{
		{"per device", DeferLimits{MaxBytesPerDevice: 2 * recSize}, []byte{0, 0, 0, 0x97, 0, 0}},
		{"total", DeferLimits{MaxTotalBytes: 2 * (recSize + queuedMsgSize)}, []byte{0, 0, 0, 0x97, 0, 0x97}},
		{"total with each message's memory", DeferLimits{MaxTotalBytes: 2*recSize + queuedMsgSize}, []byte{0, 0, 0x97, 0x97, 0, 0x97}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := start(t, fixtureOpts{rules: []devicelimit.Rule{deferRule("dev-*", 1, time.Second)},
				store: openStore(t, t.TempDir()), limits: tc.limits})
			var got []byte
			for _, dev := range []string{"dev-1", "dev-1", "dev-1", "dev-1", "dev-2", "dev-2"}[:len(tc.want)] {
				p := f.connect(t, 5, dev, "")
				got = append(got, publish5(t, p, &paho.Publish{Topic: "t/a", QoS: 1, Payload: []byte(payload)}))
				p.close()
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("acks %x, want %x", got, tc.want)
			}
			refused := strings.Count(string(tc.want), "\x97")
			if st := f.srv.Stats(); st.QueueBytes != int64(st.Deferred)*recSize || st.Deferred != uint64(len(tc.want)-2-refused) || st.Overflowed != uint64(refused) {
				t.Fatalf("stats %+v (record %d bytes)", st, recSize)
			}
		})
	}
}

// A message that waited longer than MaxAge, or past its MQTT 5 message
// expiry interval, is dropped and counted, never released late; one
// released with time left carries the remaining interval.
func TestDeferExpiry(t *testing.T) {
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{deferRule("dev-*", 1, 10*time.Second)},
		store: openStore(t, t.TempDir()), limits: DeferLimits{MaxAge: 25 * time.Second}})
	sub := f.subscribeMsgs(t, "sub", "t/#")
	p := f.connect(t, 5, "dev-1", "")
	expiry := func(s uint32) *paho.PublishProperties { return &paho.PublishProperties{MessageExpiry: &s} }
	for _, m := range []*paho.Publish{
		{Topic: "t/a", QoS: 1, Payload: []byte("first")},                               // allowed
		{Topic: "t/a", QoS: 1, Payload: []byte("short"), Properties: expiry(5)},        // expires before its turn
		{Topic: "t/a", QoS: 1, Payload: []byte("long"), Properties: expiry(60)},        // released at ~11s with ~49s left
		{Topic: "t/a", QoS: 1, Payload: []byte("old")},                                 // released at ~22s
		{Topic: "t/a", QoS: 1, Payload: []byte("too-old")},                             // its turn at ~33s: older than MaxAge
		{Topic: "t/a", QoS: 0, Payload: []byte("too-old-qos0"), Properties: expiry(1)}, // QoS 0 is deferred too
	} {
		if code := publish5(t, p, m); code != 0 {
			t.Fatalf("publish %s: 0x%02x", m.Payload, code)
		}
	}
	eventually(t, "QoS 0 deferred", func() bool { return f.srv.Stats().Deferred == 5 })
	f.releaseAll(t, sub, 1, time.Second, 60)
	if got := sub.payloads(); !equal(got, []string{"first", "long", "old"}) {
		t.Fatalf("received %q, want first, long, old", got)
	}
	long := sub.all()[1]
	if e := long.pub.Properties.MessageExpiry; e == nil || *e < 47 || *e > 49 {
		t.Fatalf("released message expiry %v, want about 49s left of 60s after %s", e, long.at.Sub(t0))
	}
	if st := f.srv.Stats(); st.Expired != 3 || st.Released != 2 || st.QueueMessages != 0 {
		t.Fatalf("stats %+v, want 3 expired, 2 released", st)
	}
}

// A released message is the message the device sent: topic, payload,
// QoS, retain flag and the MQTT 5 properties, with the instant of its
// release added last (devicelimit.ReleasedProperty), and it becomes the
// topic's retained message.
func TestDeferKeepsMessage(t *testing.T) {
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{deferRule("dev-*", 1, time.Second)}, store: openStore(t, t.TempDir())})
	sub := f.subscribeMsgs(t, "sub", "#")
	p := f.connect(t, 5, "dev-1", "")
	if code := publish5(t, p, &paho.Publish{Topic: "t/first", QoS: 1, Payload: []byte("first")}); code != 0 {
		t.Fatalf("first: 0x%02x", code)
	}
	pf := byte(1)
	sent := &paho.Publish{
		Topic: "t/dev-1/state", QoS: 2, Retain: true, Payload: []byte(`{"t":21.5}`),
		Properties: &paho.PublishProperties{
			ContentType:     "application/json",
			PayloadFormat:   &pf,
			ResponseTopic:   "reply/dev-1",
			CorrelationData: []byte{0, 1, 0xfe},
			User:            paho.UserProperties{{Key: "unit", Value: "C"}, {Key: "unit", Value: "K"}, {Key: "b", Value: ""}},
		},
	}
	before := f.clock.Now().Time() // the gateway's clock: released at a later step of it
	if code := publish5(t, p, sent); code != 0 {
		t.Fatalf("deferred publish: PUBREC 0x%02x", code)
	}
	if st := f.srv.Stats(); st.Deferred != 1 {
		t.Fatalf("stats %+v, want it deferred", st)
	}
	f.releaseAll(t, sub, 1, 500*time.Millisecond, 10)
	sub.waitLen(t, 2)
	got := sub.all()[1].pub
	after := f.clock.Now().Time()
	gp, sp := got.Properties, sent.Properties
	var released time.Time
	if gp != nil && len(gp.User) == len(sp.User)+1 && gp.User[len(sp.User)].Key == devicelimit.ReleasedProperty {
		var err error
		if released, err = time.Parse(time.RFC3339Nano, gp.User[len(sp.User)].Value); err != nil {
			t.Fatalf("release stamp: %v", err)
		}
		gp.User = gp.User[:len(sp.User)]
	}
	switch {
	case !released.After(before) || released.After(after):
		t.Fatalf("released at %v (%q), want after the publish at %v and by the receipt at %v", released, devicelimit.ReleasedProperty, before, after)
	case got.Topic != sent.Topic || string(got.Payload) != string(sent.Payload) || got.QoS != 2 || !got.Retain:
		t.Fatalf("got topic %q payload %q QoS %d retain %v, want %q %q 2 true", got.Topic, got.Payload, got.QoS, got.Retain, sent.Topic, sent.Payload)
	case gp == nil || gp.ContentType != sp.ContentType || gp.PayloadFormat == nil || *gp.PayloadFormat != 1 ||
		gp.ResponseTopic != sp.ResponseTopic || string(gp.CorrelationData) != string(sp.CorrelationData) ||
		!slices.Equal(gp.User, sp.User):
		t.Fatalf("got properties %+v, want %+v", gp, sp)
	}
	late := f.subscribeMsgs(t, "late", "t/dev-1/state")
	late.waitLen(t, 1)
	if r := late.all()[0].pub; string(r.Payload) != string(sent.Payload) || !r.Retain {
		t.Fatalf("retained %q (retain %v), want the released message", r.Payload, r.Retain)
	}
}

// Messages queued when the server closes are released by the next
// server on the same (reopened) store, in order, with sequence numbers
// continuing after the highest stored; the device need not reconnect.
func TestDeferSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	clock := devicelimit.NewManualClock(t0)
	rules := []devicelimit.Rule{deferRule("dev-*", 5, time.Second)}

	s1 := openStore(t, dir)
	f1 := start(t, fixtureOpts{rules: rules, store: s1, clock: clock})
	sub1 := f1.subscribeMsgs(t, "sub", "t/#")
	p := f1.connect(t, 5, "dev-1", "")
	want := payloads("m", 20)
	for _, m := range want {
		if code := publish5(t, p, &paho.Publish{Topic: "t/a", QoS: 1, Payload: []byte(m)}); code != 0 {
			t.Fatalf("publish %s: 0x%02x", m, code)
		}
	}
	f1.releaseStep(t, sub1, 5, 1200*time.Millisecond) // releases m5..m9
	sub1.waitLen(t, 10)
	closeNow(t, f1.srv)
	left := storedMsgs(t, s1)
	if len(left) != 10 || string(left[0].msg.Payload) != "m-10" {
		t.Fatalf("stored after close: %d messages, first %q; want m-10..m-19", len(left), left[0].msg.Payload)
	}
	maxSeq := left[len(left)-1].seq
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}

	s2 := openStore(t, dir)
	// The same table: persist restores the windows before the broker
	// starts, and m5..m9 fill dev-1's.
	f2 := start(t, fixtureOpts{rules: rules, store: s2, clock: clock, table: f1.table, releaseLoop: true})
	if st := f2.srv.Stats(); st.QueueMessages != 10 {
		t.Fatalf("restored queue: %+v, want 10 messages", st)
	}
	// The release loop's first round, at start, finds the window full.
	eventually(t, "the first round", func() bool { return f2.srv.def.visited.Load() >= 1 })
	if st := f2.srv.Stats(); st.Released != 0 {
		t.Fatalf("released %d into a full window", st.Released)
	}
	sub2 := f2.subscribeMsgs(t, "sub", "t/#")
	// The device reconnects: its new message queues behind the rest.
	p2 := f2.connect(t, 5, "dev-1", "")
	if code := publish5(t, p2, &paho.Publish{Topic: "t/a", QoS: 1, Payload: []byte("after")}); code != 0 {
		t.Fatalf("publish after restart: 0x%02x", code)
	}
	st := storedMsgs(t, s2)
	if last := st[len(st)-1]; string(last.msg.Payload) != "after" || last.seq <= maxSeq {
		t.Fatalf("new message stored as seq %d (%q), want after %d", last.seq, last.msg.Payload, maxSeq)
	}
	f2.releaseAll(t, sub2, 0, 1200*time.Millisecond, 10)
	sub2.waitLen(t, 11)
	if got, want := sub2.payloads(), append(payloads("m", 20)[10:], "after"); !equal(got, want) {
		t.Fatalf("after restart received %q, want %q", got, want)
	}
	closeNow(t, f2.srv)
	if n := len(storedMsgs(t, s2)); n != 0 {
		t.Fatalf("%d messages stored after all were released", n)
	}
}

// When the store fails, a deferral is refused like a full queue, and the
// failure is logged once, not per message.
func TestDeferStoreFailure(t *testing.T) {
	h := new(logtest.Capture)
	store := openStore(t, t.TempDir())
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{deferRule("dev-*", 1, time.Second)}, store: store, logger: slog.New(h)})
	p := f.connect(t, 5, "dev-1", "")
	if code := publish5(t, p, &paho.Publish{Topic: "t/a", QoS: 1, Payload: []byte("ok")}); code != 0 {
		t.Fatalf("first: 0x%02x", code)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		resp, _ := p.(*pub5).c.Publish(ctx, &paho.Publish{Topic: "t/a", QoS: 1, Payload: []byte("x")})
		cancel()
		if resp == nil || resp.ReasonCode != 0x97 || resp.Properties == nil ||
			resp.Properties.ReasonString != "quota exceeded: 1 messages per 1s, deferral failed" {
			t.Fatalf("publish %d with the store closed: %+v, want 0x97 deferral failed", i, resp)
		}
	}
	if st := f.srv.Stats(); st.Overflowed != 5 || st.Deferred != 0 || st.QueueMessages != 0 {
		t.Fatalf("stats %+v, want 5 overflowed", st)
	}
	if n := h.Count("deferred message not stored"); n != 1 {
		t.Fatalf("%d error lines for 5 failures, want 1", n)
	}
	if a := h.All("deferred message not stored")[0]; a["level"] != "ERROR" || !strings.Contains(a["error"], "closed") {
		t.Fatalf("log line %v", a)
	}
}

// Without a DeferStore, policy defer drops like policy drop.
func TestDeferWithoutStoreDrops(t *testing.T) {
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{deferRule("dev-*", 1, time.Second)}})
	p := f.connect(t, 5, "dev-1", "")
	for i, want := range []byte{0, 0x97} {
		if a, _ := p.publish(t, "t/a", "x", 1); a.code != want {
			t.Fatalf("publish %d: 0x%02x, want 0x%02x", i, a.code, want)
		}
	}
	if st := f.srv.Stats(); st.Dropped != 1 || st.Deferred != 0 || st.Overflowed != 0 {
		t.Fatalf("stats %+v, want 1 dropped", st)
	}
}

// newHookServer builds a server with a store, not started, and a client
// of device dev-1 to call the hook with directly.
func newHookServer(t *testing.T, q devicelimit.Quota, store DeferStore) (*Server, *mqtt.Client, packets.Packet) {
	t.Helper()
	o := validOptions(t)
	r, err := devicelimit.NewResolver(q, nil, testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	o.Resolver, o.Defer = r, store
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	cl := s.mqtt.NewClient(nil, "tcp", "dev-1", false)
	cl.Properties.ProtocolVersion = 5
	s.hook.OnSessionEstablish(cl, packets.Packet{})
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 0},
		TopicName:   "t/dev-1",
		Payload:     []byte("21.5"),
	}
	return s, cl, pk
}

// Devices publish concurrently (each in order, as mochi calls the hook)
// while release rounds run: every message is forwarded exactly once,
// each device's in the order it sent them, and the windows held.
func TestDeferConcurrentDevices(t *testing.T) {
	const devices, perDevice = 16, 60
	q := devicelimit.Quota{Limit: 5, Window: time.Second, Policy: devicelimit.PolicyDefer}
	store := openStore(t, t.TempDir())
	s, _, _ := newHookServer(t, q, store)
	clock := s.opts.Clock.(*devicelimit.ManualClock)

	// Forwards are stamped with the instant they were admitted at: the
	// clock moves only under tick's write lock; a publish holds the read
	// lock from its decision to its stamp, and a release is stamped with
	// its round's instant.
	var (
		mu    sync.Mutex
		got   = make(map[string][]string)
		at    = make(map[string][]devicelimit.Tick)
		tick  sync.RWMutex
		round devicelimit.Tick // guarded by the rounds goroutine: publish runs inside its releaseTick
	)
	forward := func(device, payload string, now devicelimit.Tick) {
		mu.Lock()
		got[device] = append(got[device], payload)
		at[device] = append(at[device], now)
		mu.Unlock()
	}
	s.def.publish = func(device string, m *deferredMsg, _ uint32) error {
		forward(device, string(m.Payload), round)
		return nil
	}

	stop := make(chan struct{})
	var rounds sync.WaitGroup
	rounds.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			tick.Lock()
			round = clock.Advance(10 * time.Millisecond)
			tick.Unlock()
			s.def.releaseTick(round)
		}
	})
	var pubs sync.WaitGroup
	for d := range devices {
		pubs.Go(func() {
			device := fmt.Sprintf("dev-%d", d)
			cl := s.mqtt.NewClient(nil, "tcp", device, false)
			cl.Properties.ProtocolVersion = 5
			s.hook.OnSessionEstablish(cl, packets.Packet{})
			for i := range perDevice {
				if i%20 == 19 {
					// Let the queue drain now and then, so publishes also
					// find it empty and the window with room.
					// (Polled here: eventually's Fatalf is for the test's goroutine.)
					for deadline := time.Now().Add(waitTimeout); s.def.queueLen(device) > 0; time.Sleep(time.Millisecond) {
						if time.Now().After(deadline) {
							t.Errorf("%s: queue not drained", device)
							return
						}
					}
				}
				payload := fmt.Sprintf("%s/%d", device, i)
				pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 1,
					TopicName: "t/" + device, Payload: []byte(payload)}
				tick.RLock()
				_, err := s.hook.OnPublish(cl, pk)
				if err == nil {
					forward(device, payload, clock.Now())
				}
				tick.RUnlock()
				if err != nil && err != errIgnore {
					t.Errorf("%s: %v", payload, err)
				}
			}
		})
	}
	pubs.Wait()
	eventually(t, "the queue to drain", func() bool { return s.Stats().QueueMessages == 0 })
	close(stop)
	rounds.Wait()

	st := s.Stats()
	t.Logf("%d allowed, %d deferred and released, over %s of logical time", st.Allowed, st.Deferred, clock.Now().Sub(t0))
	if st.Allowed+st.Deferred != devices*perDevice || st.Released != st.Deferred || st.Overflowed+st.Expired+st.Dropped != 0 {
		t.Fatalf("stats %+v", st)
	}
	for d := range devices {
		device := fmt.Sprintf("dev-%d", d)
		want := make([]string, perDevice)
		for i := range want {
			want[i] = fmt.Sprintf("%s/%d", device, i)
		}
		if !slices.Equal(got[device], want) {
			t.Fatalf("%s forwarded %q, want %q", device, got[device], want)
		}
		if m := maxInWindow(at[device], time.Second); m > q.Limit {
			t.Fatalf("%s: %d forwarded within one second", device, m)
		}
	}
	s.def.flushDeletes()
	if n, _, err := store.DeferredStats(); err != nil || n != 0 {
		t.Fatalf("%d messages left in the store (%v)", n, err)
	}
}

// Under policy defer, a publish the window admits (nothing queued)
// allocates nothing either.
func TestOnPublishDeferAllowedDoesNotAllocate(t *testing.T) {
	s, cl, pk := newHookServer(t, devicelimit.Quota{Limit: devicelimit.MaxLimit, Window: time.Second, Policy: devicelimit.PolicyDefer},
		openStore(t, t.TempDir()))
	checkAllowedPublishAllocs(t, s, cl, pk)
}

// Messages restored at start-up wait RestoreDelay before their release,
// so that backend consumers can reconnect first, even with room in the
// device's window.
func TestDeferRestoreDelay(t *testing.T) {
	dir := t.TempDir()
	clock := devicelimit.NewManualClock(t0)
	rules := []devicelimit.Rule{deferRule("dev-*", 1, time.Second)}

	_, s1 := deferSome(t, dir, clock, rules, 3) // m-0 through, m-1 and m-2 queued
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}

	clock.Advance(10 * time.Second) // the window is long empty
	s2 := openStore(t, dir)
	f2 := start(t, fixtureOpts{rules: rules, store: s2, clock: clock, limits: DeferLimits{RestoreDelay: 5 * time.Second}})
	sub := f2.subscribeMsgs(t, "sub", "t/#")
	f2.srv.releaseTick(clock.Advance(5*time.Second - time.Millisecond))
	if st := f2.srv.Stats(); st.Released != 0 || st.QueueMessages != 2 {
		t.Fatalf("before the restore delay: %+v, want nothing released", st)
	}
	f2.srv.releaseTick(clock.Advance(time.Millisecond))
	sub.waitLen(t, 1)
	if got := sub.payloads(); !equal(got, []string{"m-1"}) {
		t.Fatalf("at the restore delay received %q, want m-1", got)
	}
	f2.srv.releaseTick(clock.Advance(2 * time.Second))
	sub.waitLen(t, 2)
	closeNow(t, f2.srv)
}

// A device ID too long for the store's deferral keys cannot be queued:
// its over-limit messages are refused like a full queue (0x97 for MQTT
// 5), never acked and lost.
func TestDeferLongDeviceIDRefused(t *testing.T) {
	s := openStore(t, t.TempDir())
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{deferRule("dev-*", 1, time.Second)}, store: s})
	id := "dev-" + strings.Repeat("x", 33000)
	p := f.connect(t, 5, id, "")
	if code := publish5(t, p, &paho.Publish{Topic: "t/a", QoS: 1, Payload: []byte("m-0")}); code != 0 {
		t.Fatalf("first publish: 0x%02x, want 0x00", code)
	}
	if code := publish5(t, p, &paho.Publish{Topic: "t/a", QoS: 1, Payload: []byte("m-1")}); code != 0x97 {
		t.Fatalf("over-limit publish of a long ID: 0x%02x, want 0x97", code)
	}
	if st := f.srv.Stats(); st.QueueMessages != 0 || st.Deferred != 0 || st.Overflowed != 1 {
		t.Fatalf("stats %+v, want nothing queued and one overflowed", st)
	}
}

// A device whose quota under policy defer is 100 messages and 30 bytes
// per second sends five 10-byte messages at once: three pass (30
// bytes), two are stored and released, in order, as the byte window
// frees; a 31-byte message no window could ever take is refused (MQTT 5
// 0x97), not queued; the byte window never holds more than 30 bytes in
// any second.
func TestDeferSeveralWindows(t *testing.T) {
	store := openStore(t, t.TempDir())
	rule := devicelimit.Rule{Name: "dev-*", ClientID: "dev-*", Quota: devicelimit.WithWindows(devicelimit.PolicyDefer,
		devicelimit.Limit{Unit: devicelimit.Messages, N: 100, Window: time.Second},
		devicelimit.Limit{Unit: devicelimit.Bytes, N: 30, Window: time.Second})}
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{rule}, store: store})
	sub := f.subscribeMsgs(t, "sub", "t/#")
	p := f.connect(t, 5, "dev-1", "")
	want := []string{"m0-45678", "m1-45678", "m2-45678", "m3-45678", "m4-45678"} // 10 bytes with the "!"
	for _, m := range want {
		if code := publish5(t, p, &paho.Publish{Topic: "t/dev-1", QoS: 1, Payload: []byte(m + "!")}); code != 0 {
			t.Fatalf("publish %s: PUBACK 0x%02x, want 0x00", m, code)
		}
	}
	if code := publish5(t, p, &paho.Publish{Topic: "t/dev-1", QoS: 1, Payload: bytes.Repeat([]byte("x"), 31)}); code != 0x97 {
		t.Fatalf("a 31-byte message: PUBACK 0x%02x, want 0x97", code)
	}
	st := f.srv.Stats()
	if st.Allowed != 3 || st.Deferred != 2 || st.QueueMessages != 2 {
		t.Fatalf("after the burst: %+v, want 3 allowed, 2 deferred", st)
	}
	// Stored with the quota's windows (a version 2 record).
	if ms := storedMsgs(t, store); len(ms) != 2 || ms[0].msg.Quota != rule.Quota {
		t.Fatalf("stored %+v, want 2 messages under %v", ms, rule.Quota)
	}
	sub.waitLen(t, 3)
	f.releaseAll(t, sub, 3, 50*time.Millisecond, 100)
	sub.waitLen(t, 5)
	var got []string
	var ticks []devicelimit.Tick
	for _, r := range sub.all() {
		got = append(got, strings.TrimSuffix(string(r.pub.Payload), "!"))
		ticks = append(ticks, r.at)
	}
	if !equal(got, want) {
		t.Fatalf("received %q, want %q", got, want)
	}
	// 10 bytes each: at most 3 in any second.
	if m := maxInWindow(ticks, time.Second); m > 3 {
		t.Fatalf("%d messages (%d bytes) within one second, want at most 3 (arrivals %v)", m, 10*m, ticks)
	}
	if st := f.srv.Stats(); st.Released != 2 || st.Expired != 0 {
		t.Fatalf("after the release: %+v", st)
	}
}

// TestDeferClasses: a topic class under policy defer has a queue of its
// own per device: the device's telemetry waiting in its queue does not
// hold up its alarms, nor the other way round; each class's messages
// keep their order and their class's window; both queues are stored
// (the class's under the device ID, a NUL and the class) and restored
// after a restart, and the device's status counts both.
func TestDeferClasses(t *testing.T) {
	dir := t.TempDir()
	clock := devicelimit.NewManualClock(t0)
	rule := deferRule("dev-*", 1, time.Second)
	rule.Classes = []devicelimit.Class{{Name: "alarms", Topics: []string{"t/+/alarm"},
		Quota: devicelimit.Quota{Limit: 1, Window: time.Second, Policy: devicelimit.PolicyDefer}}}
	rules := []devicelimit.Rule{rule}
	s1 := openStore(t, dir)
	f1 := start(t, fixtureOpts{rules: rules, store: s1, clock: clock})
	p := f1.connect(t, 5, "dev-1", "")
	for _, m := range []struct{ topic, payload string }{
		{"t/dev-1", "a0"}, {"t/dev-1", "a1"}, {"t/dev-1", "a2"}, // one admitted, two queued
		{"t/dev-1/alarm", "x0"}, {"t/dev-1/alarm", "x1"}, // admitted while telemetry waits; one queued
	} {
		if code := publish5(t, p, &paho.Publish{Topic: m.topic, QoS: 1, Payload: []byte(m.payload)}); code != 0 {
			t.Fatalf("publish %s: PUBACK 0x%02x, want 0x00", m.payload, code)
		}
	}
	if st := f1.srv.Stats(); st.Allowed != 2 || st.Deferred != 3 || st.QueueMessages != 3 {
		t.Fatalf("after the burst: %+v, want 2 allowed (a0, x0), 3 deferred", st)
	}
	if n := f1.srv.DeviceStatus("dev-1").Deferred; n != 3 {
		t.Fatalf("device status: %d deferred, want 3 (its own queue and the class's)", n)
	}
	keys := map[string]int{}
	for _, m := range storedMsgs(t, s1) {
		keys[m.device]++
	}
	if keys["dev-1"] != 2 || keys["dev-1\x00alarms"] != 1 {
		t.Fatalf("stored under %v, want 2 under dev-1 and 1 under dev-1, NUL, alarms", keys)
	}
	closeNow(t, f1.srv)
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}

	s2 := openStore(t, dir)
	f2 := start(t, fixtureOpts{rules: rules, store: s2, clock: clock, table: f1.table})
	if st := f2.srv.Stats(); st.QueueMessages != 3 {
		t.Fatalf("restored queue: %+v, want 3 messages", st)
	}
	sub := f2.subscribeMsgs(t, "sub", "t/#")
	f2.releaseAll(t, sub, 0, 1100*time.Millisecond, 10)
	sub.waitLen(t, 3)
	var tele, alarms []string
	var teleAt, alarmAt []devicelimit.Tick
	for _, r := range sub.all() {
		if r.pub.Topic == "t/dev-1/alarm" {
			alarms, alarmAt = append(alarms, string(r.pub.Payload)), append(alarmAt, r.at)
		} else {
			tele, teleAt = append(tele, string(r.pub.Payload)), append(teleAt, r.at)
		}
	}
	if !equal(tele, []string{"a1", "a2"}) || !equal(alarms, []string{"x1"}) {
		t.Fatalf("released telemetry %q and alarms %q, want [a1 a2] and [x1]", tele, alarms)
	}
	if maxInWindow(teleAt, time.Second) > 1 || maxInWindow(alarmAt, time.Second) > 1 {
		t.Fatalf("released faster than 1 per second per class: telemetry %v, alarms %v", teleAt, alarmAt)
	}
	// The alarm went out in the first round, beside the first telemetry
	// message: the class's queue did not wait for the device's.
	if alarmAt[0] != teleAt[0] {
		t.Fatalf("the alarm was released at %v, the telemetry at %v: want the same round", alarmAt[0], teleAt)
	}
}

// TestQueuedMsgSizeDocumented: docs/configuration.md and docs/quotas.md
// give what max_total_bytes counts for each message beside its record
// on 64-bit platforms.
func TestQueuedMsgSizeDocumented(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the docs give the 64-bit figure")
	}
	if queuedMsgSize != 216 {
		t.Fatalf("queuedMsgSize is %d; the docs say 216 bytes a message", queuedMsgSize)
	}
}
