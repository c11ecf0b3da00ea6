package forward_test

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/forward"
	"github.com/devicegate/devicegate/forward/forwardtest"
	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/poll"
)

// TestClosingUpstreamSetAside: an upstream that ends the connection
// after a message, instead of refusing it or along with its refusal.
// One device of 20 is refused; every other device's messages arrive,
// in order, and the refused device's are all dead letters.
//
//   - MQTT 3.1.1 to a Mosquitto with max_packet_size below the refused
//     device's messages: Mosquitto closes the connection on each, and
//     the protocol has no refusal. Each is set aside, reason
//     connection_closed, after dead_after_closes (3) connections in a
//     row ended with it alone in flight. Before, the log stopped at
//     the first such message for good (the test timed out).
//   - MQTT 5 to a Mosquitto with max_queued_messages 0 and an ACL
//     denying the device's topic: Mosquitto sends PUBACK 0x87 and ends
//     the connection; with more in flight, the end is a TCP reset that
//     loses the refusal and the acknowledgements before it. The
//     messages that were in flight then go one at a time on the next
//     connection, so the refusal is read. Before, each refusal cost
//     about 4 connections (82 to 114 for 20, at the gateway's
//     backoffs) and the log flowed at 40 to 50 messages a second.
//
// DEVICEGATE_CLOSES_MEASURE=1 runs them at the gateway's backoffs and
// logs the figures of docs/forwarding-failures.md.
func TestClosingUpstreamSetAside(t *testing.T) {
	t.Run("mqtt3 packet too large", func(t *testing.T) {
		closingRun(t, mosquittotest.Options{MaxPacketSize: 2000, MaxQueued: 100000}, false, 4000, "connection_closed")
	})
	t.Run("mqtt5 refusal and close", func(t *testing.T) {
		closingRun(t, mosquittotest.Options{ACL: "topic readwrite #\ntopic deny devices/bad/t\n"}, true, 0, "not_authorized")
	})
}

// closingRun runs the scenario against a Mosquitto shaped by o (MQTT 5
// when v5), the refused device's messages padded to pad bytes, and
// checks that they all end as dead letters, of reason or
// connection_closed.
func closingRun(t *testing.T, o mosquittotest.Options, v5 bool, pad int, reason string) {
	const n, closes = 20, 3
	up := mosquittotest.StartWith(t, o)
	sub := subscribeAll(t, up.Addr)
	measure := os.Getenv("DEVICEGATE_CLOSES_MEASURE") != ""
	f, st := forwardtest.RunWith(t, "up/0", &forward.MQTT{Address: up.Addr, ClientID: "gw", V5: v5}, func(c *forward.Config) {
		c.DeadAfterCloses = closes
		if measure {
			c.MinBackoff, c.MaxBackoff, c.AckTimeout = 0, 0, 0 // the gateway's
		}
	})
	var good []string
	for i := range 19 {
		good = append(good, "dev-"+strconv.Itoa(i))
	}
	start := time.Now()
	for i := 1; i <= n; i++ {
		for _, d := range append(good, "bad") {
			p := strconv.Itoa(i)
			if d == "bad" && pad > 0 {
				p += ":" + strings.Repeat("x", pad)
			}
			if err := f.Append(&forward.Message{Device: d, Topic: "devices/" + d + "/t", QoS: 1, Payload: []byte(p)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	poll.Until(t, 120*time.Second, "the log gone through", func() bool {
		// The counts follow the move's commit.
		s := f.Stats()
		return forwardtest.Backlog(t, st, "up/0") == 0 && deadOf(s, reason) >= n
	})
	took := time.Since(start)
	dups := 0
	for _, d := range good {
		dups += forwardtest.InOrder(t, d, sub.of("devices/"+d+"/t"), n)
	}
	if bad := sub.of("devices/bad/t"); len(bad) != 0 {
		t.Fatalf("%d refused messages reached the subscriber", len(bad))
	}
	s := f.Stats()
	dead, total, err := f.DeadLetters(-1)
	if err != nil || total != n || deadOf(s, reason) != n {
		t.Fatalf("%d dead letters, by reason %v, %v; want %d", total, s.DeadByReason, err, n)
	}
	for _, d := range dead {
		if d.Message.Device != "bad" {
			t.Fatalf("dead letter of %s: %+v", d.Message.Device, d)
		}
		if d.Reason == "connection_closed" && !strings.Contains(d.Error, "closed the connection 3 times in a row") {
			t.Fatalf("dead letter: %+v", d)
		}
	}
	t.Logf("%d messages (%d refused) through in %s, %.0f msg/s; %d connections; dead letters %v; %d duplicates of the 19 others' %d",
		20*n, n, took.Round(time.Millisecond), float64(20*n)/took.Seconds(), f.Attempts(), s.DeadByReason, dups, 19*n)
}

// deadOf counts the dead letters of reason or connection_closed.
func deadOf(s forward.Stats, reason string) uint64 {
	n := s.DeadByReason["connection_closed"]
	if reason != "connection_closed" {
		n += s.DeadByReason[reason]
	}
	return n
}
