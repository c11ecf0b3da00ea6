package broker

import (
	"slices"

	"github.com/devicegate/devicegate/devicelimit"
)

// DeferredMessage is one message in a device's deferral queue.
type DeferredMessage struct {
	Topic string
	// Class is the topic class whose queue holds it; "" for the
	// device's own quota.
	Class string
	// Size is its payload's bytes; QoS its QoS.
	Size int
	QoS  byte
	// Enqueued is when it was deferred.
	Enqueued devicelimit.Tick
}

// Deferred returns the first n of device's deferred messages, in the
// order they were deferred (each queue, the device's own and its
// classes', is released in that order), and how many it has in all.
// Without a DeferStore it has none.
func (s *Server) Deferred(device string, n int) ([]DeferredMessage, int) {
	if s.def == nil {
		return nil, 0
	}
	return s.def.list(device, n)
}

// list is Deferred: it copies what it needs of the queues under the
// shard's lock and decodes the records (immutable once queued) after.
func (d *deferrer) list(device string, n int) ([]DeferredMessage, int) {
	type item struct {
		class string
		msg   queuedMsg
	}
	var items []item
	sh := d.shard(device)
	sh.mu.Lock()
	for _, dq := range sh.queues {
		if dq.device == device {
			for _, m := range dq.msgs {
				items = append(items, item{dq.class, m})
			}
		}
	}
	sh.mu.Unlock()
	slices.SortFunc(items, func(a, b item) int {
		switch {
		case a.msg.seq < b.msg.seq:
			return -1
		case a.msg.seq > b.msg.seq:
			return 1
		}
		return 0
	})
	out := make([]DeferredMessage, 0, min(n, len(items)))
	for _, it := range items[:min(n, len(items))] {
		m := DeferredMessage{Class: it.class, Size: it.msg.size, Enqueued: it.msg.enqueued}
		if rec, err := decodeStored(it.msg.rec); err == nil {
			m.Topic, m.QoS = rec.Topic, rec.QoS
		}
		out = append(out, m)
	}
	return out, len(items)
}
