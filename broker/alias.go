package broker

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// OnPacketRead puts the topic an MQTT 5 topic alias stands for into a
// PUBLISH that carries the alias alone. mochi asks the ACL about the
// topic as sent and resolves the alias only after, so without this every
// alias-only publish of an authenticated device was refused as a publish
// to the empty topic. The ACL then judges the resolved topic; an alias
// only ever stands for a topic the ACL allowed when it was set, since a
// refused publish does not set it. Provided only when the ACL is on.
func (h *authHook) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Type == packets.Publish && pk.TopicName == "" && pk.Properties.TopicAliasFlag &&
		pk.Properties.TopicAlias > 0 && pk.Properties.TopicAlias <= h.srv.Options.Capabilities.TopicAliasMaximum {
		// Set with an empty topic returns the alias's topic; for an
		// alias never set it records "", as mochi would next.
		pk.TopicName = cl.State.TopicAliases.Inbound.Set(pk.Properties.TopicAlias, "")
	}
	return pk, nil
}
