package forward

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/logtest"
	"github.com/devicegate/devicegate/internal/poll"
	"github.com/devicegate/devicegate/persist"
)

// flappingDialer connects every time, to a connection that ends at once
// with a reason (a destination that accepts the connection and refuses
// every message), and records when it was dialled.
type flappingDialer struct {
	mu    sync.Mutex
	dials []time.Time
}

func (d *flappingDialer) Addr() string { return "flap://test" }

func (d *flappingDialer) Dial(context.Context) (Conn, error) {
	d.mu.Lock()
	d.dials = append(d.dials, time.Now())
	d.mu.Unlock()
	c := &flapConn{Ending: NewEnding()}
	c.EndWith(errors.New("produce refused"))
	return c, nil
}

func (d *flappingDialer) times() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]time.Time(nil), d.dials...)
}

type flapConn struct{ *Ending }

func (c *flapConn) Send(*Message, byte) Ack { return Failed(errors.New("not sent")) }
func (c *flapConn) Close()                  {}

// TestFlappingConnectionBacksOff: a connection the destination accepts
// and that ends at once, having acknowledged nothing, does not start the
// backoff over: the attempts space out as for a refused dial (seven in,
// at least 32 ms apart with a backoff from 1 ms doubling), instead of
// one every millisecond; the failure is logged once, with the
// destination's reason.
func TestFlappingConnectionBacksOff(t *testing.T) {
	st, err := persist.Open(t.TempDir(), persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d := new(flappingDialer)
	logs := new(logtest.Capture)
	f, err := New(Config{Name: "flap/0", Dial: d, MinBackoff: time.Millisecond, MaxBackoff: 200 * time.Millisecond}, st, slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	poll.Until(t, 10*time.Second, "eight attempts", func() bool { return len(d.times()) >= 8 })
	cancel()
	<-done
	ts := d.times()
	if gap := ts[7].Sub(ts[6]); gap < 32*time.Millisecond {
		t.Fatalf("the 8th attempt %s after the 7th: the backoff started over on every flap", gap)
	}
	lines := logs.All("upstream unavailable; messages wait in the forward log")
	if len(lines) != 1 || lines[0]["error"] != "connection lost: produce refused" {
		t.Fatalf("logged %v, want one line with the destination's reason", lines)
	}
}

// recordingDialer connects to one connection that acknowledges every
// message at once and keeps what it was sent.
type recordingDialer struct {
	mu   sync.Mutex
	sent []Message
}

func (d *recordingDialer) Addr() string { return "rec://test" }

func (d *recordingDialer) Dial(context.Context) (Conn, error) {
	return &recordingConn{d: d, Ending: NewEnding()}, nil
}

func (d *recordingDialer) messages() []Message {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Message(nil), d.sent...)
}

type recordingConn struct {
	d *recordingDialer
	*Ending
}

func (c *recordingConn) Send(m *Message, _ byte) Ack {
	c.d.mu.Lock()
	cp := *m
	if m.Props != nil {
		p := *m.Props
		cp.Props = &p
	}
	c.d.sent = append(c.d.sent, cp)
	c.d.mu.Unlock()
	return Failed(nil) // acknowledged
}
func (c *recordingConn) Close() { c.End() }

// TestMessageExpiryHonoured: a message's MQTT 5 Message Expiry Interval
// counts the time it waited in the forward log: one whose interval ran
// out while the destination was away is not sent (counted expired), one
// with time left is sent with what is left, rounded up to the second;
// one without the property is sent as it is.
func TestMessageExpiryHonoured(t *testing.T) {
	st, err := persist.Open(t.TempDir(), persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	d := new(recordingDialer)
	f, err := New(Config{Name: "exp/0", Dial: d, Now: func() time.Time { return now }}, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []Message{
		{Device: "d", Topic: "t/gone", QoS: 1, At: now.Add(-10 * time.Minute), Props: &Props{MessageExpiry: 60}},
		{Device: "d", Topic: "t/left", QoS: 1, At: now.Add(-20*time.Second - time.Millisecond), Props: &Props{MessageExpiry: 60}},
		{Device: "d", Topic: "t/plain", QoS: 1, At: now.Add(-time.Hour)},
	} {
		if err := f.Append(&m); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	poll.Until(t, 10*time.Second, "the log sent", func() bool { return f.Stats().Backlog == 0 })
	cancel()
	<-done
	sent := d.messages()
	if len(sent) != 2 || sent[0].Topic != "t/left" || sent[0].Props.MessageExpiry != 40 || sent[1].Topic != "t/plain" || sent[1].Props != nil {
		t.Fatalf("sent %+v; want t/left with 40 s left, then t/plain", sent)
	}
	if st := f.Stats(); st.Expired != 1 {
		t.Fatalf("expired %d, want 1", st.Expired)
	}
}
