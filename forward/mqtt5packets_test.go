package forward

import (
	"bufio"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"

	"github.com/devicegate/devicegate/internal/loopback"
)

// TestMQTT5PacketsWhole: paho.golang's goroutines write to the
// connection at once (the pinger, the acknowledgements of commands,
// the SUBSCRIBE, the forwarder's publishes), each packet as several
// Writes; every packet reaches the upstream whole, in each writer's
// order. Before, paho did not hold the batchConn across a packet's
// Writes (it holds a sync.Locker only), and parts of the packets of
// several writers interleaved: this test read a malformed packet every
// run, and a PINGREQ inside Dial's SUBSCRIBE made mochi close about one
// MQTT 5 connection in 500 (TestRedialSameIDAfterRefusedSubscribe).
func TestMQTT5PacketsWhole(t *testing.T) {
	near, far := loopback.Pair(t)
	bc := newBatchConn(near)
	t.Cleanup(func() { _ = bc.Close() })
	conn := pahoConn(bc)

	const writers, each = 4, 500
	var wg sync.WaitGroup
	failed := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				p := &packets.Publish{Topic: "t/" + strconv.Itoa(w), QoS: 1, PacketID: uint16(w*each + i + 1),
					Payload:    []byte(strconv.Itoa(i)),
					Properties: &packets.Properties{User: []packets.User{{Key: IDProperty, Value: fmt.Sprintf("%d-%d", w, i)}}}}
				if _, err := p.WriteTo(conn); err != nil {
					failed <- err
					return
				}
				if _, err := packets.NewControlPacket(packets.PINGREQ).WriteTo(conn); err != nil {
					failed <- err
					return
				}
			}
		}()
	}

	_ = far.SetReadDeadline(time.Now().Add(30 * time.Second)) // a bound on a hang: bytes lost in a packet read as another's
	r := bufio.NewReader(far)
	next := make([]int, writers)
	for n := range 2 * writers * each {
		cp, err := packets.ReadPacket(r)
		if err != nil {
			t.Fatalf("packet %d: %v", n, err)
		}
		switch p := cp.Content.(type) {
		case *packets.Pingreq:
		case *packets.Publish:
			w, err := strconv.Atoi(p.Topic[len("t/"):])
			if err != nil || w < 0 || w >= writers {
				t.Fatalf("packet %d: a PUBLISH to %q, not one written", n, p.Topic)
			}
			if got, want := string(p.Payload), strconv.Itoa(next[w]); got != want {
				t.Fatalf("packet %d: writer %d's PUBLISH %q, want %q", n, w, got, want)
			}
			next[w]++
		default:
			t.Fatalf("packet %d: %s, not one written", n, cp.PacketType())
		}
	}
	wg.Wait()
	close(failed)
	for err := range failed {
		t.Fatal(err)
	}
}
