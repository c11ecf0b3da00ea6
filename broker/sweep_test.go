package broker

import (
	"testing"
	"testing/synctest"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
)

// The sweep loop calls tick every SweepInterval, and stops on Close.
func TestSweepLoop(t *testing.T) {
	o := validOptions(t)
	clock := o.Clock.(*devicelimit.ManualClock)
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	q := devicelimit.Quota{Limit: 5, Window: time.Second}
	o.Table.AllowAt("dev-1", q, clock.Now())
	clock.Advance(2 * time.Second)

	synctest.Test(t, func(t *testing.T) {
		s.startSweep()
		time.Sleep(DefaultSweepInterval - time.Nanosecond)
		synctest.Wait()
		if n := o.Table.Len(); n != 1 {
			t.Fatalf("swept before the interval: %d windows", n)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if n := o.Table.Len(); n != 0 {
			t.Fatalf("%d windows after one interval, want 0", n)
		}
		close(s.stop)
		<-s.loopDone
	})
}

func newHookClient(t testing.TB, q devicelimit.Quota) (*Server, *mqtt.Client, packets.Packet) {
	table, err := devicelimit.NewTable(testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	resolver, err := devicelimit.NewResolver(q, nil, testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{TCPAddr: "127.0.0.1:0", Table: table, Resolver: resolver, Clock: devicelimit.NewManualClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	cl := s.mqtt.NewClient(nil, "tcp", "dev-1", false)
	cl.Properties.ProtocolVersion = 5
	s.hook.OnSessionEstablish(cl, packets.Packet{})
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		TopicName:   "t/dev-1",
		Payload:     []byte("21.5"),
		PacketID:    7,
	}
	return s, cl, pk
}

// The hot path, an allowed publish, allocates nothing.
func TestOnPublishAllowedDoesNotAllocate(t *testing.T) {
	s, cl, pk := newHookClient(t, devicelimit.Quota{Limit: devicelimit.MaxLimit, Window: time.Second})
	checkAllowedPublishAllocs(t, s, cl, pk)
}

// checkAllowedPublishAllocs fails unless an allowed publish, after the
// first (which creates the window), allocates nothing.
func checkAllowedPublishAllocs(t *testing.T, s *Server, cl *mqtt.Client, pk packets.Packet) {
	t.Helper()
	if _, err := s.hook.OnPublish(cl, pk); err != nil { // creates the window
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := s.hook.OnPublish(cl, pk); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per allowed publish, want 0", allocs)
	}
}

// quiet is feedback off: the benchmarks of the decision path measure it
// without the device feedback (BenchmarkOnPublishFeedback has that).
var quiet = devicelimit.Feedback{Mode: devicelimit.FeedbackOff}

func BenchmarkOnPublishAllowed(b *testing.B) {
	s, cl, pk := newHookClient(b, devicelimit.Quota{Limit: devicelimit.MaxLimit, Window: time.Second, Feedback: quiet})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.hook.OnPublish(cl, pk); err != nil {
			b.Fatal(err)
		}
	}
}

// Over the limit, QoS 0: the refusal path without a connection to write to.
func BenchmarkOnPublishDropped(b *testing.B) {
	s, cl, pk := newHookClient(b, devicelimit.Quota{Limit: 1, Window: time.Second, Feedback: quiet})
	pk.FixedHeader.Qos = 0
	b.ReportAllocs()
	for b.Loop() {
		_, _ = s.hook.OnPublish(cl, pk)
	}
}
