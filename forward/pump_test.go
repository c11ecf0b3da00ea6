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

// ackOnceDialer connects every time, to a connection that acknowledges
// the first message it is sent and then ends (an upstream that drops
// every connection after a message), and records when it was dialled.
type ackOnceDialer struct{ flappingDialer }

func (d *ackOnceDialer) Dial(context.Context) (Conn, error) {
	d.mu.Lock()
	d.dials = append(d.dials, time.Now())
	d.mu.Unlock()
	return &ackOnceConn{Ending: NewEnding()}, nil
}

type ackOnceConn struct{ *Ending }

func (c *ackOnceConn) Send(*Message, byte) Ack {
	a := NewPending()
	a.Finish(nil)
	c.EndWith(errors.New("dropped after one message"))
	return a
}
func (c *ackOnceConn) Close() {}

// TestAckThenDropBacksOff: an upstream that acknowledges one message on
// each connection and then drops it is not dialled again at once: each
// attempt waits at least the first step of the backoff (half of
// MinBackoff, with jitter), and every message goes. Before, a
// connection that had a message acknowledged made the next attempt at
// once: dials in a loop, as fast as the upstream accepted them.
func TestAckThenDropBacksOff(t *testing.T) {
	st, err := persist.Open(t.TempDir(), persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d := new(ackOnceDialer)
	const minBackoff = 40 * time.Millisecond
	f := startForwarder(t, Config{Name: "drop/0", Dial: d, MinBackoff: minBackoff, MaxBackoff: time.Second}, st, nil)
	const n = 10
	for i := range n {
		if err := f.Append(msg("devices/d/t", string(rune('a'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, 20*time.Second, "every message acknowledged", func() bool { return f.Stats().Forwarded == n })
	ts := d.times()
	for i := 1; i < len(ts); i++ {
		if gap := ts[i].Sub(ts[i-1]); gap < minBackoff/2 {
			t.Fatalf("attempt %d %s after the one before, after a connection that acknowledged a message and dropped: want at least %s",
				i+1, gap, minBackoff/2)
		}
	}
}
