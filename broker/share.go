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
