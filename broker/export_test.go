package broker

import "github.com/devicegate/devicegate/devicelimit"

// publishInline publishes as the server itself (mochi's inline client),
// the way deferred messages will be released.
func (s *Server) publishInline(topic string, payload []byte, qos byte) error {
	return s.Publish(topic, payload, false, qos)
}

// connCount returns the number of connections the throttle caches.
func (h *throttle) connCount() int {
	n := 0
	h.conns.m.Range(func(_, v any) bool {
		if v.(*regEntry).info.Load() != nil {
			n++
		}
		return true
	})
	return n
}

// open returns the number of connections the listener tracks.
func (l *tcpListener) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// queueForTest queues n messages for device under quota q, enqueued now, as the
// store would have them after a restart, and schedules the device due at
// due, waking the release loop if wake is set and it is the earliest.
// For tests of the release loop alone: nothing is stored.
func (d *deferrer) queueForTest(device string, q devicelimit.Quota, n int, now, due devicelimit.Tick, wake bool) {
	sh := d.shard(device)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	dq := sh.queues[device]
	if dq == nil {
		dq = &devQueue{device: device}
		sh.queues[device] = dq
	}
	for range n {
		m := deferredMsg{Enqueued: now, Quota: q, Version: 5, QoS: 1, Topic: "t/" + device, Payload: []byte(device)}
		rec := appendDeferred(nil, &m)
		dq.msgs = append(dq.msgs, queuedMsg{seq: d.seq.Add(1), enqueued: now, quota: q, rec: rec})
		dq.bytes += int64(len(rec))
		d.queueMsgs.Add(1)
		d.queueBytes.Add(int64(len(rec)))
		d.budget.Add(int64(len(rec)) + queuedMsgSize)
	}
	if !dq.scheduled {
		d.schedule(dq, due, wake)
	}
}
