package broker

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// restoreSendQuota gives back the send quota of a QoS 1 or 2 message
// mochi v2.7.9 sent from its queue. When a client that announced a
// Receive Maximum has that many messages unacknowledged, mochi queues
// the next ones in its in-flight list, and sends one of them after each
// packet the client sends while the client has quota again; but it then
// deletes that message from the list (server.go, processPacket), so the
// client's PUBACK (or PUBCOMP) for it finds nothing and the quota it
// took is never given back. Every queued message cost the client one
// unit of its Receive Maximum for good, until none was left and mochi
// sent it nothing more: its messages waited until mqtt.max_inflight of
// them were queued, and the rest were dropped.
//
// An acknowledgment for a packet ID that is not in flight gives one
// unit back (mochi caps the quota at the client's Receive Maximum). A
// client that acknowledges what it never received only raises its own
// quota to its own maximum. Called from OnPacketRead, before mochi
// processes the packet.
func restoreSendQuota(cl *mqtt.Client, pk *packets.Packet) {
	if t := pk.FixedHeader.Type; t != packets.Puback && t != packets.Pubcomp {
		return
	}
	if _, ok := cl.State.Inflight.Get(pk.PacketID); !ok {
		cl.State.Inflight.IncreaseSendQuota()
	}
}
