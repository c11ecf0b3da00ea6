package broker

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// OnPublishDropped reports a message mochi dropped for a client whose
// queue of writes (Limits.MaxPendingWrites) is full: a subscriber that
// stopped reading, or reads more slowly than messages come for it. mochi
// drops it without a word (a Debug line at most); the line logged here
// goes through mochi's logger, so mochiHandler counts it with the other
// slow-subscriber drops (Stats.SlowSubscriberDrops) and logs one per
// mochiLogWindow.
func (h *authHook) OnPublishDropped(cl *mqtt.Client, _ packets.Packet) {
	h.srv.Log.Warn(mochiWriteQueueFull, "client", cl.ID, "listener", cl.Net.Listener)
}
