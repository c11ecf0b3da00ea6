package broker

import (
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// drainTimeout bounds how long Close waits for subscribers to take the
// messages already on their way to them.
const drainTimeout = 2 * time.Second

// drainPoll is how often draining looks at the subscribers' in-flight
// messages.
const drainPoll = 10 * time.Millisecond

// drain is the first step of a graceful stop. A device's QoS 1 or 2
// publish is acknowledged once it is queued for the subscribers, so
// closing every connection at once loses what was acknowledged but not
// yet delivered. drain hangs up the clients without subscriptions (the
// devices that only publish), so no new message comes in, then waits
// until no connected subscriber has a QoS 1 or 2 delivery in flight, or
// drainTimeout has passed. QoS 0 deliveries are not tracked by mochi and
// are not waited for.
func (s *Server) drain() {
	for _, cl := range s.mqtt.Clients.GetAll() {
		if !cl.Net.Inline && !cl.Closed() && cl.State.Subscriptions.Len() == 0 {
			_ = s.mqtt.DisconnectClient(cl, packets.ErrServerShuttingDown)
		}
	}
	deadline := time.Now().Add(drainTimeout)
	for inFlight(s.mqtt) && time.Now().Before(deadline) {
		time.Sleep(drainPoll) // polling mochi's state, not letting time pass
	}
}

// inFlight reports whether a connected client still has a delivery
// waiting for its acknowledgement.
func inFlight(m *mqtt.Server) bool {
	for _, cl := range m.Clients.GetAll() {
		if !cl.Net.Inline && !cl.Closed() && cl.State.Inflight.Len() > 0 {
			return true
		}
	}
	return false
}
