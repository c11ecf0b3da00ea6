package forward

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/persist"
)

// TestReplayIntoFullLog: a replay that the forward log refuses partway
// (overflow refuse_new at max_bytes; no upstream takes anything) moves
// the dead letters it appended out of the dead-letter log, says how
// many with the error, and leaves the rest: a second replay sends none
// of them twice. Before, it answered 0 with the error and kept all five
// dead letters, two of them already in the forward log, to be sent again.
func TestReplayIntoFullLog(t *testing.T) {
	st, err := persist.Open(t.TempDir(), persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	payload := []byte(strings.Repeat("x", 1000))
	m := Message{Device: "dev-1", At: time.Now(), Topic: "devices/dev-1/t", QoS: 1, Payload: payload}
	for seq := uint64(1); seq <= 5; seq++ {
		rec := appendRecord(nil, &m)
		seal(rec, seq)
		if err := st.AppendForward("up/0", seq, rec); err != nil {
			t.Fatal(err)
		}
		if _, err := st.MoveForwardDead("up/0", seq, appendDead(nil, time.Now(), "not_authorized", "refused", rec), MaxDeadLetters); err != nil {
			t.Fatal(err)
		}
	}
	size := int64(len(appendRecord(nil, &Message{Device: "dev-1", At: time.Now(), Topic: "devices/dev-1/t", QoS: 1, Payload: payload, ID: "up/0/5"})))
	// Nothing listens on port 1 of loopback: the log only grows.
	f := startForwarder(t, Config{Name: "up/0", Dial: &MQTT{Address: "127.0.0.1:1", ClientID: "gw-test-0"}, Map: Map{Local: "devices/", Remote: "site-7/devices/"},
		MaxQoS: 1, AckTimeout: time.Second, MinBackoff: time.Second, MaxBackoff: time.Second,
		Overflow: RefuseNew, MaxBytes: 2*size + size/2}, st, nil)
	n, err := f.ReplayDead()
	if n != 2 || !errors.Is(err, ErrFull) {
		t.Fatalf("replay into a log with room for 2: %d, %v; want 2 and %v", n, err, ErrFull)
	}
	if left := f.Stats().DeadLetters; left != 3 || logLen(t, st) != 2 {
		t.Fatalf("after the replay: %d dead letters, %d in the log; want 3 and 2", left, logLen(t, st))
	}
	if n, err := f.ReplayDead(); n != 0 || !errors.Is(err, ErrFull) || logLen(t, st) != 2 || f.Stats().DeadLetters != 3 {
		t.Fatalf("second replay into the full log: %d, %v, log %d, dead %d; want 0, %v, 2, 3", n, err, logLen(t, st), f.Stats().DeadLetters, ErrFull)
	}
}
