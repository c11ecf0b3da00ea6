package broker

import (
	"sync"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// A forwarded QoS 1 publish is acknowledged only once it is durable in
// the forward log. Waiting for that in OnPublish would hold the
// client's read loop for a whole group commit (an fsync) per message:
// mochi reads a client's next packet only after the hook returns, so a
// commit would carry one message per publisher. Instead the throttle
// queues the append and hands the publish to the client's acker, and
// returns ErrRejectPacket (mochi acks and publishes nothing). The acker,
// in the order the publishes came, waits until each is durable, writes
// its PUBACK and publishes it to the local subscribers, as the device
// (an inline client named after it; the throttle lets such publishes
// pass uncounted). Any publish of the client that is not queued this
// way (QoS 0 or 2, refused, deferred, not forwarded) first waits until
// the acker is idle (barrier), so PUBACKs and local deliveries keep the
// order of the publishes.

// forwardedListener names the inline clients that publish locally what
// an acker acknowledged.
const forwardedListener = "forwarded"

// ackerQueue bounds a client's publishes waiting for their commit;
// beyond it OnPublish waits (mochi does not count these against the
// client's Receive Maximum, as it does not see them in flight).
const ackerQueue = 256

// acker acknowledges one client's forwarded publishes in order.
type acker struct {
	q       chan *pendingAck // pointers: a packet is large, and most slots stay empty
	pending sync.WaitGroup   // pushed and not yet done
	mu      sync.Mutex
	closed  bool
}

type pendingAck struct {
	pk    packets.Packet
	wait  func() error           // returns when the message is durable
	props []packets.UserProperty // the device's feedback (feedback.go)
}

// ackerOf returns c's acker, started on first use. Called from OnPublish
// only, which mochi runs in order per client.
func (h *throttle) ackerOf(cl *mqtt.Client, c *connInfo) *acker {
	if c.ack == nil {
		c.ack = &acker{q: make(chan *pendingAck, ackerQueue)}
		go h.runAcker(cl, c.ack)
	}
	return c.ack
}

// push queues p; false when the acker is closed (the connection is
// gone), and then the caller waits itself.
func (a *acker) push(p *pendingAck) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	a.pending.Add(1)
	a.q <- p // may wait for room: the acker drains without the lock
	return true
}

// barrier waits until everything pushed is acknowledged (or failed).
func (a *acker) barrier() {
	if a != nil {
		a.pending.Wait()
	}
}

// close ends the acker once what it holds is done.
func (a *acker) close() {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.closed {
		a.closed = true
		close(a.q)
	}
}

func (h *throttle) runAcker(cl *mqtt.Client, a *acker) {
	for p := range a.q {
		h.finishForwarded(cl, p.pk, p.props, p.wait())
		a.pending.Done()
	}
}

// finishForwarded ends a queued publish: durable, it is counted allowed,
// acknowledged (if the connection is still there; it is forwarded
// upstream either way) and published locally; otherwise counted dropped
// and not acknowledged, so the device sends it again.
func (h *throttle) finishForwarded(cl *mqtt.Client, pk packets.Packet, props []packets.UserProperty, err error) {
	if err != nil {
		h.dropped.Add(1)
		if h.logs.allow(logForward, "", refusalLogWindow) {
			h.log.Error("message not acknowledged: the forward log did not take it", "client", cl.ID, "topic", pk.TopicName, "error", err)
		}
		return
	}
	h.allowed.Add(1)
	_ = cl.WritePacket(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: pk.PacketID, Properties: packets.Properties{User: props}})
	h.publishLocal(cl, pk)
}

// publishLocal publishes pk to the local subscribers as cl, through an
// inline client of the pool.
func (h *throttle) publishLocal(cl *mqtt.Client, pk packets.Packet) {
	if h.consumers.acquire() {
		defer h.consumers.done()
	}
	inl := <-h.inlines
	defer func() { h.inlines <- inl }()
	inl.ID = cl.ID
	inl.Properties.ProtocolVersion = cl.Properties.ProtocolVersion
	pk.Properties.TopicAlias, pk.Properties.TopicAliasFlag = 0, false // resolved already; the alias is cl's
	if err := h.srv.InjectPacket(inl, pk); err != nil && h.logs.allow(logForward, "local", refusalLogWindow) {
		h.log.Error("acknowledged message not published locally", "client", cl.ID, "topic", pk.TopicName, "error", err)
	}
}

// inlinePool is how many inline clients publish acknowledged forwarded
// messages at once (mochi's clients are large: a few, reused).
const inlinePool = 4

func newInlinePool(srv *mqtt.Server) chan *mqtt.Client {
	ch := make(chan *mqtt.Client, inlinePool)
	for range inlinePool {
		ch <- srv.NewClient(nil, forwardedListener, "", true)
	}
	return ch
}
