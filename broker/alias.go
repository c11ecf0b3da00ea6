package broker

import (
	"strconv"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// OnPacketRead checks a CONNECT (connectcheck.go), and puts the topic an MQTT 5 topic alias stands for into a
// PUBLISH that carries the alias alone. mochi asks the ACL about the
// topic as sent and resolves the alias only after, so without this every
// alias-only publish of an authenticated device was refused as a publish
// to the empty topic. The ACL then judges the resolved topic; an alias
// only ever stands for a topic the ACL allowed when it was set, since a
// refused publish does not set it.
//
// An alias the client never set is a protocol error (MQTT 5, 3.3.2.3.4):
// mochi acked such a publish with success and delivered it nowhere. The
// client gets DISCONNECT 0x82 and the publish is dropped. An alias above
// the maximum announced in the CONNACK gets DISCONNECT 0x94.
func (h *authHook) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	restoreSendQuota(cl, &pk)
	h.remaps.read(cl, &pk) // packetids.go
	if pk.FixedHeader.Type == packets.Connect {
		if f := checkConnect(&pk); f != nil {
			return pk, h.refuseConnect(cl, &pk, f)
		}
		return pk, nil
	}
	if pk.FixedHeader.Type == packets.Publish && pk.Properties.TopicAlias > h.srv.Options.Capabilities.TopicAliasMaximum {
		// mochi would send DISCONNECT 0x94 too, but neither count nor
		// log it, nor say which maximum.
		max := h.srv.Options.Capabilities.TopicAliasMaximum
		code := packets.ErrTopicAliasInvalid
		code.Reason = "topic alias " + strconv.Itoa(int(pk.Properties.TopicAlias)) + " is above the maximum " + strconv.Itoa(int(max))
		h.protocolRefused(cl.Net.Remote, false, "topic alias above the maximum")
		_ = h.srv.DisconnectClient(cl, code)
		return pk, code
	}
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

// announceAliasMaximum announces the topic alias maximum in an MQTT 5
// CONNACK that accepts the client (the throttle's OnPacketEncode calls
// it: feedback.go): mochi v2.7.9 enforces its
// Capabilities.TopicAliasMaximum (a larger alias gets DISCONNECT 0x94)
// but never tells the client, which therefore had to assume 0 (MQTT 5,
// 3.2.2.3.8) while aliases it was not allowed to use were accepted.
func announceAliasMaximum(srv *mqtt.Server, cl *mqtt.Client, pk *packets.Packet) {
	if pk.FixedHeader.Type == packets.Connack && pk.ReasonCode == 0 && cl.Properties.ProtocolVersion == 5 {
		pk.Properties.TopicAliasMaximum = srv.Options.Capabilities.TopicAliasMaximum
	}
}
