package broker

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/eclipse/paho.golang/paho"
)

// A graceful Close delivers what it acknowledged: a subscriber slow to
// take 20 QoS 1 messages, all acknowledged to the device, still gets
// every one. Close first hangs up the device (it subscribes to nothing),
// then waits for the subscriber's deliveries in flight.
func TestCloseDeliversWhatItAcknowledged(t *testing.T) {
	f := start(t, fixtureOpts{})
	gate := make(chan struct{})
	var mu sync.Mutex
	var got []string
	sub := mustConnect5(t, dialTCP(t, f.addr), login{id: "backend"}, func(p *paho.Publish) {
		<-gate // a slow consumer: nothing is acknowledged until the gate opens
		mu.Lock()
		got = append(got, string(p.Payload))
		mu.Unlock()
	})
	if code := sub.subscribe(t, "devices/#"); code != 1 {
		t.Fatalf("subscribe: 0x%02x", code)
	}
	dev := mustConnect5(t, dialTCP(t, f.addr), login{id: "meter-1"}, nil)
	const n = 20
	for i := range n {
		if a, err := dev.publish(t, "devices/meter-1", fmt.Sprint(i), 1); err != nil || a.code != 0 {
			t.Fatalf("publish %d: %+v %v", i, a, err)
		}
	}

	closed := make(chan error, 1)
	go func() { closed <- f.srv.Close(context.Background()) }()
	<-dev.lost() // Close has begun: the publisher is hung up first
	close(gate)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != n {
		t.Fatalf("the subscriber got %d of the %d acknowledged messages: %q", len(got), n, got)
	}
}
