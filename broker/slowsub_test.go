package broker

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/eclipse/paho.golang/paho"
)

// TestSlowSubscriberDropsCounted: a QoS 1 subscriber that acknowledges
// nothing gets Limits.MaxInflight messages; the rest are dropped for it,
// counted in Stats.SlowSubscriberDrops, and logged once per interval
// with the client, not once per message as mochi does.
func TestSlowSubscriberDropsCounted(t *testing.T) {
	var buf lockedBuffer
	const inflight, n = 16, 200
	f := start(t, fixtureOpts{
		logger:  slog.New(slog.NewTextHandler(&buf, nil)),
		options: func(o *Options) { o.Limits.MaxInflight = inflight },
	})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()

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
	for _, l := range buf.lines() {
		if strings.Contains(l, "client store quota reached") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "client=backend-slow") {
		t.Fatalf("%d log lines for %d drops, want 1 naming the client:\n%s", len(lines), n-inflight, strings.Join(lines, "\n"))
	}
}
