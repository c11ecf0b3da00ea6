package forward

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"devicegate/internal/logtest"
	"devicegate/internal/poll"
	"devicegate/persist"
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
