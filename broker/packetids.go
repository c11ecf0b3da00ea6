package broker

import (
	"sync"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// MQTT gives each direction of a session its own packet IDs: a client
// may publish under the ID of a delivery the server has in flight to
// it. mochi v2.7.9 keeps one in-flight list per client for both, and a
// client's QoS 1 or 2 publish under the ID of a delivery in flight
// (processPublish) deleted the delivery: a downlink command was never
// sent again, and the kept session's copy was removed as acknowledged.
// idRemaps moves such a publish, as mochi sees it, to a packet ID free
// in both directions, and writes the client's own ID back into what the
// server answers about it (PUBACK, PUBREC, PUBCOMP) and reads it from
// the client's PUBREL: the delivery stays in flight, the client sees
// its own IDs. Remaps are per client ID, so they follow a session
// taken over by a new connection; a clean start and a session's end
// drop them. Safe for concurrent use.
type idRemaps struct {
	n atomic.Int64 // clients with remaps: the fast path reads it alone
	m sync.Map     // client ID -> *clientRemaps
}

// clientRemaps is one client's remaps (its packets come one at a time
// from its read loop; acks are encoded from other goroutines too).
type clientRemaps struct {
	mu   sync.Mutex
	in   map[uint16]uint16 // the client's ID -> the one mochi sees
	back map[uint16]uint16 // the one mochi sees -> the client's
}

// read moves the packet ID of a client's QoS 1 or 2 PUBLISH off a
// delivery in flight (or off an ID already moved onto), and gives a
// PUBREL of a moved flow the ID mochi knows it by (OnPacketRead).
func (r *idRemaps) read(cl *mqtt.Client, pk *packets.Packet) {
	if cl.Net.Inline {
		return
	}
	switch pk.FixedHeader.Type {
	case packets.Publish:
		if pk.FixedHeader.Qos == 0 {
			return
		}
		id := pk.PacketID
		var c *clientRemaps
		if r.n.Load() > 0 {
			if v, ok := r.m.Load(cl.ID); ok {
				c = v.(*clientRemaps)
				c.mu.Lock()
				defer c.mu.Unlock()
				if y, ok := c.in[id]; ok {
					pk.PacketID = y // the same flow again (a resend), or its ID reused
					return
				}
			}
		}
		if !r.collides(cl, c, id) {
			return
		}
		if c == nil {
			v, loaded := r.m.LoadOrStore(cl.ID, &clientRemaps{in: map[uint16]uint16{}, back: map[uint16]uint16{}})
			if !loaded {
				r.n.Add(1)
			}
			c = v.(*clientRemaps)
			c.mu.Lock()
			defer c.mu.Unlock()
		}
		y := r.free(cl, c)
		if y == 0 {
			return // no ID free: as mochi would
		}
		c.in[id], c.back[y] = y, id
		pk.PacketID = y
	case packets.Pubrel:
		if r.n.Load() == 0 {
			return
		}
		if v, ok := r.m.Load(cl.ID); ok {
			c := v.(*clientRemaps)
			c.mu.Lock()
			if y, ok := c.in[pk.PacketID]; ok {
				pk.PacketID = y
			}
			c.mu.Unlock()
		}
	}
}

// collides reports whether a client's publish under id would meet a
// delivery in flight to it, or an ID a remap of its uses (c.mu held
// when c is not nil).
func (r *idRemaps) collides(cl *mqtt.Client, c *clientRemaps, id uint16) bool {
	if c != nil {
		if _, ok := c.back[id]; ok {
			return true
		}
	}
	if cl.State.Inflight.Len() == 0 {
		return false // a device that only publishes: Get copies a whole packet
	}
	pk, ok := cl.State.Inflight.Get(id)
	return ok && serverFlow(pk)
}

// free returns the highest packet ID neither in flight nor a remap's
// (c.mu held); 0 when there is none. Deliveries take IDs from the low
// end, clients mostly too.
func (r *idRemaps) free(cl *mqtt.Client, c *clientRemaps) uint16 {
	for y := uint16(0xffff); y > 0; y-- {
		if _, used := c.back[y]; used {
			continue
		}
		if _, used := c.in[y]; used {
			continue
		}
		if _, used := cl.State.Inflight.Get(y); !used {
			return y
		}
	}
	return 0
}

// encode writes the client's own packet ID into the server's PUBACK,
// PUBREC or PUBCOMP of a moved flow; a PUBACK or PUBCOMP ends the
// flow's remap (OnPacketEncode).
func (r *idRemaps) encode(cl *mqtt.Client, pk *packets.Packet) {
	if r == nil || r.n.Load() == 0 {
		return
	}
	t := pk.FixedHeader.Type
	if t != packets.Puback && t != packets.Pubrec && t != packets.Pubcomp {
		return
	}
	v, ok := r.m.Load(cl.ID)
	if !ok {
		return
	}
	c := v.(*clientRemaps)
	c.mu.Lock()
	defer c.mu.Unlock()
	x, ok := c.back[pk.PacketID]
	if !ok {
		return
	}
	if t != packets.Pubrec {
		delete(c.back, pk.PacketID)
		delete(c.in, x)
	}
	pk.PacketID = x
}

// drop forgets the remaps of client ID id (a clean start, a session
// ended).
func (r *idRemaps) drop(id string) {
	if r.n.Load() == 0 {
		return
	}
	if _, ok := r.m.LoadAndDelete(id); ok {
		r.n.Add(-1)
	}
}

// serverFlow reports whether pk, as mochi hands it to OnQosComplete or
// OnQosDropped, belongs to a flow the server started (a delivery to
// the client, a command maybe), not to one the client started under
// the same packet ID: the client's PUBACK, PUBREC and PUBCOMP as read
// (a remaining length) answer a delivery, the server's own (built)
// answer the client's publish; the server's PUBREL (in flight, built)
// continues a delivery, the client's (read) its own publish.
func serverFlow(pk packets.Packet) bool {
	read := pk.FixedHeader.Remaining > 0
	switch pk.FixedHeader.Type {
	case packets.Puback, packets.Pubrec, packets.Pubcomp:
		return read
	case packets.Pubrel:
		return !read
	}
	return true // a delivery (PUBLISH), or only its ID (an away session's expired)
}

// OnSessionEstablished drops the remaps of a client that started clean.
func (h *authHook) OnSessionEstablished(cl *mqtt.Client, pk packets.Packet) {
	if pk.Connect.Clean {
		h.remaps.drop(cl.ID)
	}
}

// OnDisconnect drops the remaps of a session that ends with its
// connection; a session taken over keeps them for the new one.
func (h *authHook) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	if expire && !cl.IsTakenOver() {
		h.remaps.drop(cl.ID)
	}
}

// OnClientExpired drops the remaps of a session whose expiry passed.
func (h *authHook) OnClientExpired(cl *mqtt.Client) { h.remaps.drop(cl.ID) }
