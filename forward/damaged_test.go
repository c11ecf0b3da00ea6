package forward

import (
	"strconv"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/poll"
	"github.com/devicegate/devicegate/persist"
)

// TestDamagedRecordsSetAside: a forward log whose records carry
// checksums, one with a damaged payload byte and one stored under
// another sequence number than it was written for (a damaged key): both
// fail their checksum, are counted and set aside with the dead letters
// (reason damaged), never forwarded; the rest arrive in order. A replay
// leaves them; drop deletes them. Before, a damaged payload was
// forwarded as if sound and a damaged number reordered the log.
func TestDamagedRecordsSetAside(t *testing.T) {
	up := mosquittotest.Start(t)
	sub := subscribe(t, up.Addr, "site-7/#")
	st, err := persist.Open(t.TempDir(), persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for seq := uint64(1); seq <= 20; seq++ {
		rec := appendRecord(nil, &Message{Device: "dev-1", At: time.Now(), Topic: "devices/dev-1/t", QoS: 1, Payload: []byte(strconv.Itoa(int(seq)))})
		seal(rec, seq)
		switch seq {
		case 7:
			rec[len(rec)-1] ^= 0x01 // the payload's last byte
		case 12:
			seal(rec, 99) // written for another number
		}
		if err := st.AppendForward("up/0", seq, rec); err != nil {
			t.Fatal(err)
		}
	}
	f := startForwarder(t, Config{Name: "up/0", Dial: &MQTT{Address: up.Addr, ClientID: "gw-test-0"}, Map: Map{Local: "devices/", Remote: "site-7/devices/"},
		MaxQoS: 1, AckTimeout: time.Second, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}, st, nil)
	poll.Until(t, 20*time.Second, "the log gone through", func() bool { return f.Stats().Backlog == 0 && sub.firsts(t) == 18 })
	sub.mu.Lock()
	for _, p := range sub.got {
		if p == "7" || p == "12" || p == "6\x00" {
			t.Errorf("damaged record %q forwarded", p)
		}
	}
	sub.mu.Unlock()
	s := f.Stats()
	if s.DeadByReason["damaged"] != 2 || s.DeadLetters != 2 {
		t.Fatalf("stats %+v, want 2 damaged set aside", s)
	}
	dead, _, err := f.DeadLetters(-1)
	if err != nil || len(dead) != 2 || dead[0].Seq != 7 || dead[1].Seq != 12 || !dead[0].Damaged || !dead[1].Damaged || dead[0].Reason != "damaged" {
		t.Fatalf("dead letters %+v, %v", dead, err)
	}
	if n, err := f.ReplayDead(); err != nil || n != 0 || f.Stats().DeadLetters != 2 {
		t.Fatalf("replay of damaged records: %d, %v, %d left; want none replayed, both kept", n, err, f.Stats().DeadLetters)
	}
	if n, err := f.DropDead(); err != nil || n != 2 {
		t.Fatalf("drop: %d, %v", n, err)
	}
}
