package forward

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/devicegate/devicegate/persist"
)

// TestLogHasNoGaps: however many devices append at once, what the
// forward log holds at any moment is a run of sequence numbers without a
// gap. A gap (a higher number committed before a lower one) would let
// the pump, which reads on from the newest number it read, send a
// device's later message before its earlier one.
func TestLogHasNoGaps(t *testing.T) {
	st, err := persist.Open(t.TempDir(), persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	f, err := New(Config{Name: "up/0", Dial: &MQTT{Address: "127.0.0.1:1", ClientID: "gw"}}, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	const devices, each = 32, 100
	var stop atomic.Bool
	gaps := make(chan string, 1)
	var reads atomic.Int64
	go func() {
		for !stop.Load() {
			var prev uint64
			_ = st.ReadForward("up/0", 0, func(seq uint64, _ []byte) bool {
				if prev != 0 && seq != prev+1 {
					select {
					case gaps <- fmt.Sprintf("%d follows %d", seq, prev):
					default:
					}
					return false
				}
				prev = seq
				return true
			})
			reads.Add(1)
		}
	}()
	var wg sync.WaitGroup
	for d := range devices {
		wg.Go(func() {
			for i := range each {
				if err := f.Append(msg(fmt.Sprintf("devices/dev-%d/t", d), fmt.Sprint(i))); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	stop.Store(true)
	select {
	case g := <-gaps:
		t.Fatalf("the log held a gap: %s (%d reads)", g, reads.Load())
	default:
	}
	t.Logf("%d reads of the log during %d appends, no gap", reads.Load(), devices*each)
}
