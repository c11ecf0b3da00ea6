package broker

import mqtt "github.com/mochi-mqtt/server/v2"

// hookEvents is a set of mochi hook events, for a hook's Provides. mochi
// v2.7.9 asks every hook's Provides at every event it dispatches (for a
// QoS 0 message about eight events, so some forty calls over the
// gateway's hooks); a switch over a hook's many cases cost 40 to 80
// instructions a call (callgrind over a whole gateway under
// bench/loadgen), an index into the set a few.
type hookEvents [256]bool

// eventsOf returns the set of events es.
func eventsOf(es ...byte) *hookEvents {
	var s hookEvents
	for _, e := range es {
		s[e] = true
	}
	return &s
}

// The fixed sets of the hooks whose answer never changes.
var (
	authEvents = eventsOf(mqtt.OnConnect, mqtt.OnConnectAuthenticate, mqtt.OnACLCheck,
		mqtt.OnPacketRead, mqtt.OnSubscribe, mqtt.OnSelectSubscribers, mqtt.OnPublishDropped, mqtt.OnPublished, // alias.go, share.go, drops.go, consumers.go (its CONNACK encode: the throttle's OnPacketEncode)
		mqtt.OnSessionEstablished, mqtt.OnDisconnect, mqtt.OnClientExpired) // packetids.go
	takeoverEvents = eventsOf(mqtt.OnSessionEstablish, mqtt.OnDisconnect)
	throttleEvents = eventsOf(mqtt.OnSessionEstablish, mqtt.OnDisconnect, mqtt.OnPublish, mqtt.OnPacketEncode)
	// sessionEvents, and sessionStoreEvents for a hook that keeps
	// sessions in the data file.
	sessionEvents = eventsOf(mqtt.OnSessionEstablish, mqtt.OnSessionEstablished, mqtt.OnSubscribed, mqtt.OnUnsubscribed,
		mqtt.OnDisconnect, mqtt.OnClientExpired, mqtt.OnQosPublish, mqtt.OnQosComplete, mqtt.OnQosDropped)
	sessionStoreEvents = eventsOf(mqtt.OnSessionEstablish, mqtt.OnSessionEstablished, mqtt.OnSubscribed, mqtt.OnUnsubscribed,
		mqtt.OnDisconnect, mqtt.OnClientExpired, mqtt.OnQosPublish, mqtt.OnQosComplete, mqtt.OnQosDropped,
		mqtt.StoredClients, mqtt.StoredSubscriptions, mqtt.StoredInflightMessages)
)
