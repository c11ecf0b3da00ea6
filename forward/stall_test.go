package forward

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/poll"
)

// stops is how many times TestGracefulCloseNoStall stops the upstream.
const stops = 25

// TestGracefulCloseNoStall: an MQTT 3.1.1 upstream (a real Mosquitto)
// stopped gracefully 25 times while 20 devices publish: each time the
// forwarder notices and dials again within the acknowledgement timeout
// (paho's Publish, without a write timeout, blocked 30 s on a
// connection the broker had closed), and nothing is lost.
func TestGracefulCloseNoStall(t *testing.T) {
	const ackTimeout = 5 * time.Second // the default
	up := mosquittotest.Start(t)
	sub := subscribe(t, up.Addr, "site-7/#")
	f, st := runForwarder(t, Config{Name: "up/0", Dial: &MQTT{Address: up.Addr, ClientID: "gw-test-0"}, Map: Map{Local: "devices/", Remote: "site-7/devices/"},
		MaxQoS: 1, Window: 100, AckTimeout: ackTimeout, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	poll.Until(t, 10*time.Second, "the upstream connection", f.Connected)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var appended atomic.Int64
	for d := range 20 {
		dev := "dev-" + strconv.Itoa(d)
		wg.Go(func() {
			for i := 1; ; i++ {
				if err := f.Append(&Message{Device: dev, Topic: "devices/" + dev + "/t", QoS: 1, Payload: []byte(strconv.Itoa(i))}); err != nil {
					t.Error(err)
					return
				}
				appended.Add(1)
				select {
				case <-stop:
					return
				default:
				}
			}
		})
	}
	var worst time.Duration
	stalls := 0
	for range stops {
		before := f.Forwarded()
		poll.Until(t, 10*time.Second, "messages flowing", func() bool { return f.Forwarded() > before+50 })
		attempts := f.Attempts()
		up.Stop()
		stopped := time.Now()
		for f.Attempts() == attempts && time.Since(stopped) < 40*time.Second {
			time.Sleep(time.Millisecond) // polling the forwarder
		}
		took := time.Since(stopped)
		worst = max(worst, took)
		// The promise is the acknowledgement timeout: a close the
		// connection does not report is noticed when it fires. The next
		// attempt comes after a backoff (50 ms at most here) and the
		// scheduler's delay on a loaded machine, which the margin allows.
		if took > ackTimeout+250*time.Millisecond {
			stalls++
		}
		up.Restart()
	}
	close(stop)
	wg.Wait()
	poll.Until(t, 30*time.Second, "the backlog drained", func() bool { return logLen(t, st) == 0 })
	if stalls > 0 {
		t.Fatalf("%d of %d graceful stops stalled the forwarder longer than the acknowledgement timeout %s and 250ms (worst %s)", stalls, stops, ackTimeout, worst)
	}
	t.Logf("%d graceful stops under load (%d messages): worst time to notice %s, %d forwarded", stops, appended.Load(), worst, f.Forwarded())
	_ = sub
}
