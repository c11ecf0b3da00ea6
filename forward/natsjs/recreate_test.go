package natsjs

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/devicegate/devicegate/forward"
	"github.com/devicegate/devicegate/forward/forwardtest"
	"github.com/devicegate/devicegate/internal/natstest"
	"github.com/devicegate/devicegate/internal/poll"
)

// TestStreamRecreatedKeepsOrder: one device's messages flow while its
// stream is deleted and re-created, 0.3 s later and at once, twice
// each. Every stream, read just before it is deleted and at the end,
// holds the device's messages in order but for what the forwarder
// counts as reordered (Stats.Reordered: messages stored ahead of an
// earlier one that failed), which is 0 here. Before, the client's own
// retries of a publish no stream answered (twice, 250 ms apart) stored
// it after later ones: 4 of 4 events broke the order, about 240
// messages each (474 498 475 499 500 476 ...), uncounted.
func TestStreamRecreatedKeepsOrder(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	js := srv.JetStream()
	cfg := jetstream.StreamConfig{Name: "DEVICES", Subjects: []string{"devices.>"}, Storage: jetstream.FileStorage}
	stream := srv.CreateStream("DEVICES", "devices.>")
	f, st := forwardtest.Run(t, "streams/0", &Dialer{URLs: srv.URL})

	var appended atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := f.Append(&forward.Message{Device: "meter-1", Topic: "devices/meter-1/t", QoS: 1, Payload: []byte(strconv.Itoa(i))}); err != nil {
				t.Error(err)
				return
			}
			appended.Store(int64(i))
		}
	}()
	inversions := 0
	check := func(what string, s jetstream.Stream) {
		t.Helper()
		late, sample := lateMessages(stored(t, s)["meter-1"])
		inversions += late
		t.Logf("%s: %d messages stored after a later one %v", what, late, sample)
	}
	for i, gap := range []time.Duration{300 * time.Millisecond, 0, 300 * time.Millisecond, 0} {
		from := f.Forwarded()
		poll.Until(t, 30*time.Second, "200 more messages stored", func() bool { return f.Forwarded() >= from+200 })
		check("before deletion "+strconv.Itoa(i), stream)
		if err := js.DeleteStream(ctx, "DEVICES"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(gap) // the stream's absence is the test's subject
		var err error
		if stream, err = js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	from := f.Forwarded()
	poll.Until(t, 30*time.Second, "200 more messages stored", func() bool { return f.Forwarded() >= from+200 })
	close(stop)
	<-done
	poll.Until(t, 30*time.Second, "the log sent", func() bool { return forwardtest.Backlog(t, st, "streams/0") == 0 })
	check("at the end", stream)
	s := f.Stats()
	t.Logf("%d messages appended; %d stored out of order, %d counted reordered", appended.Load(), inversions, s.Reordered)
	if uint64(inversions) > s.Reordered {
		t.Fatalf("%d messages stored after a later one of their device, %d counted (devicegate_forward_reordered_total)", inversions, s.Reordered)
	}
}

// lateMessages counts the payloads (numbers) of got, in stream order,
// first seen after a greater one, and returns up to 6 around the first.
func lateMessages(got []string) (int, []string) {
	late, highest := 0, 0
	seen := map[int]bool{}
	var sample []string
	for i, p := range got {
		n, _ := strconv.Atoi(p)
		if seen[n] {
			continue
		}
		seen[n] = true
		if n < highest {
			if late == 0 {
				sample = got[max(i-3, 0):min(i+3, len(got))]
			}
			late++
		}
		highest = max(highest, n)
	}
	return late, sample
}
