package forward

import (
	"errors"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/freeport"
	"github.com/devicegate/devicegate/internal/logtest"
	"github.com/devicegate/devicegate/internal/poll"
	"github.com/devicegate/devicegate/persist"
)

// deadAddr is a loopback address nothing listens on: an upstream that is
// down for the whole test.
func deadAddr(t *testing.T) string {
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func overflowForwarder(t *testing.T, max int64, policy Overflow) (*Forwarder, *persist.Store) {
	t.Helper()
	return runForwarder(t, Config{Name: "up/0", Dial: &MQTT{Address: deadAddr(t), ClientID: "gw"}, MaxQoS: 1, MaxBytes: max, Overflow: policy,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
}

// recordSize is the size of the test's records: "devices/d/t" and a
// 3-digit payload.
var recordSize = int64(len(appendRecord(nil, &Message{Device: "dev-1", At: time.Now(), Topic: "devices/d/t", QoS: 1, Payload: []byte("100")})))

// TestOverflowDropOldest: with the upstream down, a log bounded to 10
// messages keeps the newest ones; the dropped are counted.
func TestOverflowDropOldest(t *testing.T) {
	f, st := overflowForwarder(t, 10*recordSize, DropOldest)
	for i := 100; i < 150; i++ {
		if err := f.Append(msg("devices/d/t", strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, 10*time.Second, "the log trimmed to its bound", func() bool { return f.Stats().BacklogBytes <= 10*recordSize })
	var first string
	n := 0
	if err := st.ReadForward("up/0", 0, func(_ uint64, rec []byte) bool {
		m, _ := decodeRecord(rec)
		p := m.Payload
		if n == 0 {
			first = string(p)
		}
		n++
		return true
	}); err != nil {
		t.Fatal(err)
	}
	s := f.Stats()
	if n != 10 || first != "140" || s.Backlog != 10 || s.DroppedOldest != 40 {
		t.Fatalf("log holds %d from %q, stats %+v; want the newest 10 (140..149) and 40 dropped", n, first, s)
	}
}

// TestOverflowRefuseNew: with the upstream down, a log bounded to 10
// messages refuses the 11th and after (ErrFull), counted, and keeps the
// first ten.
func TestOverflowRefuseNew(t *testing.T) {
	var logs logtest.Capture
	f, _ := runForwarderLog(t, Config{Name: "up/0", Dial: &MQTT{Address: deadAddr(t), ClientID: "gw"}, MaxQoS: 1, MaxBytes: 10 * recordSize,
		Overflow: RefuseNew, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}, slog.New(&logs))
	for i := 100; i < 120; i++ {
		err := f.Append(msg("devices/d/t", strconv.Itoa(i)))
		if want := i >= 110; errors.Is(err, ErrFull) != want {
			t.Fatalf("message %d: %v (full: want %v)", i, err, want)
		}
	}
	if s := f.Stats(); s.Backlog != 10 || s.Refused != 10 || s.DroppedOldest != 0 {
		t.Fatalf("stats %+v, want 10 kept and 10 refused", s)
	}
	// Logged, once for the ten (at most once per 10 s).
	if n := logs.Count("forward log full; new messages refused (overflow: refuse_new)"); n != 1 {
		t.Fatalf("%d lines for the refusals, want 1", n)
	}
}
