package broker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// startLogged starts a broker with limits, logging into the returned
// buffer, and a context that ends with the test or after waitTimeout.
func startLogged(t *testing.T, limits Limits) (*fixture, *lockedBuffer, context.Context) {
	buf := &lockedBuffer{}
	f := start(t, fixtureOpts{
		logger:  slog.New(slog.NewTextHandler(buf, nil)),
		options: func(o *Options) { o.Limits = limits },
	})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return f, buf, ctx
}

// TestSlowSubscriberDropsCounted: a QoS 1 subscriber that acknowledges
// nothing gets Limits.MaxInflight messages; the rest are dropped for it,
// counted in Stats.SlowSubscriberDrops, and logged once per interval
// with the client, not once per message as mochi does.
func TestSlowSubscriberDropsCounted(t *testing.T) {
	const inflight, n = 16, 200
	f, buf, ctx := startLogged(t, Limits{MaxInflight: inflight})

	// Manual acknowledgment, and it never acknowledges.
	conn, err := net.DialTimeout("tcp", f.addr, waitTimeout)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{}, n)
	slow := paho.NewClient(paho.ClientConfig{
		ClientID: "backend-slow", Conn: conn, EnableManualAcknowledgment: true,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(paho.PublishReceived) (bool, error) {
			got <- struct{}{}
			return true, nil
		}},
	})
	if _, err := slow.Connect(ctx, &paho.Connect{ClientID: "backend-slow", CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = slow.Disconnect(&paho.Disconnect{}) })
	if _, err := slow.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "devices/#", QoS: 1}}}); err != nil {
		t.Fatal(err)
	}

	pub := f.dial5(t, "meter-1", "", nil)
	for i := range n {
		if _, err := pub.Publish(ctx, &paho.Publish{Topic: "devices/meter-1", QoS: 1, Payload: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the slow subscriber's messages and the drops", func() bool {
		return len(got) == inflight && f.srv.Stats().SlowSubscriberDrops == n-inflight
	})
	var lines []string
	for _, l := range buf.Lines() {
		if strings.Contains(l, "client store quota reached") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "client=backend-slow") {
		t.Fatalf("%d log lines for %d drops, want 1 naming the client:\n%s", len(lines), n-inflight, strings.Join(lines, "\n"))
	}
}

// TestWriteQueueDropsCounted: a QoS 0 subscriber that stops reading
// fills its socket, then its queue of Limits.MaxPendingWrites messages;
// mochi then drops each new message for it without a word. They are
// counted with the other slow-subscriber drops and logged once per
// interval.
func TestWriteQueueDropsCounted(t *testing.T) {
	const pending = 16
	f, buf, ctx := startLogged(t, Limits{MaxPendingWrites: pending})
	drops := fillStuckSubscriber(t, f, ctx)
	var lines []string
	for _, l := range buf.Lines() {
		if strings.Contains(l, "write queue full") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "client=backend-stuck") {
		t.Fatalf("%d log lines for %d drops, want 1 naming the client:\n%s", len(lines), drops, strings.Join(lines, "\n"))
	}
}

// TestDropsCountedAtAnyLogLevel: with the log at error (or discarded),
// the drops mochi reports as warnings are counted all the same.
func TestDropsCountedAtAnyLogLevel(t *testing.T) {
	f := start(t, fixtureOpts{
		logger:  slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError})),
		options: func(o *Options) { o.Limits = Limits{MaxPendingWrites: 16} },
	})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	fillStuckSubscriber(t, f, ctx)
}

// fillStuckSubscriber publishes 400 messages of 64 KiB (25 MiB, more
// than loopback's socket buffers and a small queue hold) to a raw
// subscriber that reads nothing, waits for drops to be counted and
// returns them.
func fillStuckSubscriber(t *testing.T, f *fixture, ctx context.Context) uint64 {
	t.Helper()
	const n = 400
	rawSubscriber(t, f.addr, "backend-stuck", "devices/#")
	pub := f.dial5(t, "meter-1", "", nil)
	payload := make([]byte, 64<<10)
	for range n {
		if _, err := pub.Publish(ctx, &paho.Publish{Topic: "devices/meter-1", QoS: 0, Payload: payload}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "drops for the stuck subscriber", func() bool { return f.srv.Stats().SlowSubscriberDrops > 0 })
	drops := f.srv.Stats().SlowSubscriberDrops
	t.Logf("%d of %d messages dropped for the stuck subscriber", drops, n)
	return drops
}

// TestConsumerQueueAccounting: 50 publishers send a burst of 5,000 QoS 0
// messages of 2 KiB while a subscriber of devices/# reads nothing; then
// it reads. At the default queue (64 messages) it misses messages, and
// every one it does not get is counted in Stats.SlowSubscriberDrops,
// none lost uncounted. Configured as a consumer (Limits.Consumers, a
// write spool of 64 MiB) it gets every message.
func TestConsumerQueueAccounting(t *testing.T) {
	const publishers, each = 50, 100
	for _, tc := range []struct {
		name     string
		limits   Limits
		consumer bool
	}{{"default", Limits{}, false}, {"consumer", Limits{Consumers: []string{"backend-*"}}, true}} {
		t.Run(tc.name, func(t *testing.T) {
			f, _, ctx := startLogged(t, tc.limits)
			sub := rawSubscriber(t, f.addr, "backend-1", "devices/#")
			payload := make([]byte, 2048)
			var wg sync.WaitGroup
			for i := range publishers {
				pub := f.dial5(t, fmt.Sprintf("meter-%d", i), "", nil)
				wg.Go(func() {
					for range each {
						if _, err := pub.Publish(ctx, &paho.Publish{Topic: fmt.Sprintf("devices/meter-%d", i), QoS: 0, Payload: payload}); err != nil {
							t.Error(err)
							return
						}
					}
					// A QoS 1 publish after the burst: acked once the
					// broker has handled every message before it.
					if _, err := pub.Publish(ctx, &paho.Publish{Topic: fmt.Sprintf("devices/meter-%d/done", i), QoS: 1, Payload: []byte("x")}); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			// The consumer reads now: every burst message arrives or is
			// counted dropped (the 50 "done" messages too).
			want := uint64(publishers*each + publishers)
			got := uint64(0)
			for {
				drops := f.srv.Stats().SlowSubscriberDrops
				if got+drops == want {
					// A consumer loses a message only to a publish that
					// waited consumerWait at the gate and went on without
					// room: on a machine so loaded that the consumer's
					// writer got no processor for a second. The docs allow
					// that; each such publish costs it one message at most.
					if expired := f.srv.AuthStats().ConsumerWaitsExpired; tc.consumer && drops > expired {
						t.Fatalf("%d drops for a consumer with a write spool, %d publishes past the gate's wait", drops, expired)
					}
					if !tc.consumer && drops == 0 {
						t.Fatal("no drops at the default queue for a subscriber that read nothing during 10 MiB")
					}
					if spooled := f.srv.AuthStats().ConsumersSpooled; spooled != map[bool]uint64{true: 1}[tc.consumer] {
						t.Fatalf("%d connections spooled", spooled)
					}
					t.Logf("received %d, dropped and counted %d, of %d; %d publishes past the gate's wait", got, drops, want, f.srv.AuthStats().ConsumerWaitsExpired)
					return
				}
				if got+drops > want {
					t.Fatalf("received %d + dropped %d > sent %d", got, drops, want)
				}
				if p := readPacket(t, sub); p.typ>>4 == 3 {
					got++
				}
			}
		})
	}
}

// rawSubscriber connects id over MQTT 5 on a raw connection (deadline
// waitTimeout, closed with the test) and subscribes it to filter at
// QoS 0; the caller reads what comes.
func rawSubscriber(t *testing.T, addr, id, filter string) net.Conn {
	t.Helper()
	sub := dialTCP(t, addr)
	t.Cleanup(func() { sub.Close() })
	_ = sub.SetDeadline(time.Now().Add(waitTimeout))
	if _, err := sub.Write(rawConnectV(5, id, props(), nil)); err != nil {
		t.Fatal(err)
	}
	readPacket(t, sub)
	if _, err := sub.Write(packet(0x82, append(append(u16(1), 0), append(mqttString(filter), 0)...))); err != nil {
		t.Fatal(err)
	}
	if p := readPacket(t, sub); p.typ>>4 != 9 || reasonOf(p) != 0 {
		t.Fatalf("SUBACK: % x", p.body)
	}
	return sub
}
