package broker

import (
	"strconv"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// OnPacketRead puts the topic an MQTT 5 topic alias stands for into a
// PUBLISH that carries the alias alone. mochi asks the ACL about the
// topic as sent and resolves the alias only after, so without this every
// alias-only publish of an authenticated device was refused as a publish
// to the empty topic. The ACL then judges the resolved topic; an alias
// only ever stands for a topic the ACL allowed when it was set, since a
// refused publish does not set it.
//
// An alias the client never set is a protocol error (MQTT 5, 3.3.2.3.4):
// mochi acked such a publish with success and delivered it nowhere. The
// client gets DISCONNECT 0x82 and the publish is dropped.
func (h *authHook) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	restoreSendQuota(cl, pk)
	if pk.FixedHeader.Type == packets.Publish && pk.TopicName == "" && pk.Properties.TopicAliasFlag &&
		pk.Properties.TopicAlias > 0 && pk.Properties.TopicAlias <= h.srv.Options.Capabilities.TopicAliasMaximum {
		// Set with an empty topic returns the alias's topic; for an
		// alias never set it records "", as mochi would next.
		pk.TopicName = cl.State.TopicAliases.Inbound.Set(pk.Properties.TopicAlias, "")
		if pk.TopicName == "" {
			code := packets.ErrProtocolViolation
			code.Reason = "topic alias " + strconv.Itoa(int(pk.Properties.TopicAlias)) + " was never set"
			h.protocolRefused(cl.Net.Remote, false, "topic alias never set")
			_ = h.srv.DisconnectClient(cl, code)
			return pk, code
		}
	}
	return pk, nil
}
