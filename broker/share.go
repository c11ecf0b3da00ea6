package broker

import (
	"slices"
	"strings"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// sharePrefix starts a shared subscription's filter (MQTT 5, 4.8.2).
const sharePrefix = "$share/"

// OnSubscribe refuses a shared subscription with an empty share name,
// "$share//t" (MQTT 5, [MQTT-4.8.2-1]), which mochi v2.7.9 granted: the
// filter gets SUBACK 0x8F, topic filter invalid (MQTT 3.1.1: 0x80), like
// the other malformed shared filters mochi refuses itself. It does so by
// handing mochi the filter "$share", which mochi's filter check refuses
// ([MQTT-4.8.2-1] too); the other filters of the SUBSCRIBE are not
// touched.
func (h *authHook) OnSubscribe(_ *mqtt.Client, pk packets.Packet) packets.Packet {
	copied := false
	for i, sub := range pk.Filters {
		if len(sub.Filter) > len(sharePrefix) && sub.Filter[len(sharePrefix)] == '/' &&
			strings.EqualFold(sub.Filter[:len(sharePrefix)], sharePrefix) {
			if !copied { // the caller's packet keeps its filters
				pk.Filters, copied = slices.Clone(pk.Filters), true
			}
			pk.Filters[i].Filter = "$share"
		}
	}
	return pk
}

// OnSelectSubscribers keeps a message whose topic begins with '$' ($SYS,
// for one) from the shared subscriptions whose filter, after
// "$share/NAME/", begins with a wildcard: MQTT 4.7.2-1 says such a
// filter does not match such a topic. mochi v2.7.9 applies the rule to
// plain subscriptions only, so "$share/g/#" received every $SYS
// message. It runs only for a message some shared subscription matched.
func (h *authHook) OnSelectSubscribers(subs *mqtt.Subscribers, pk packets.Packet) *mqtt.Subscribers {
	if pk.TopicName == "" || pk.TopicName[0] != '$' {
		return subs
	}
	for filter := range subs.Shared {
		if f := sharedTopicFilter(filter); f != "" && (f[0] == '+' || f[0] == '#') {
			delete(subs.Shared, filter)
		}
	}
	return subs
}

// sharedTopicFilter returns the topic filter of a shared subscription's
// filter "$share/NAME/FILTER" ("" when it is none).
func sharedTopicFilter(filter string) string {
	if len(filter) <= len(sharePrefix) || !strings.EqualFold(filter[:len(sharePrefix)], sharePrefix) {
		return ""
	}
	rest := filter[len(sharePrefix):]
	i := strings.IndexByte(rest, '/')
	if i < 0 {
		return ""
	}
	return rest[i+1:]
}
