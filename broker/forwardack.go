package broker

import (
	"sync"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/forward"
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
//
// One commit makes many of a client's publishes durable at once, so the
// acker works in runs: the first publish waited for, then those queued
// behind it whose commit has ended already (Ready: no wait), up to
// ackerRun. Their PUBACKs leave in one write (the connection's writes
// held meanwhile, holdwrites.go), then they are published locally, in
// order. A publish not yet durable ends the run: nothing is held while
// the acker waits, and no PUBACK waits behind a later publish's commit
// nor behind a local delivery of a later publish.

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

// ackerRun bounds the publishes one run acknowledges in one write.
const ackerRun = 64

type pendingAck struct {
	pk      packets.Packet
	durable forward.Queued         // the message's appends
	props   []packets.UserProperty // the device's feedback (feedback.go)
	err     error                  // the appends' outcome, once waited for
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

// poll returns the next publish queued, or nil when none is (or the
// acker is closed), without waiting.
func (a *acker) poll() *pendingAck {
	select {
	case p := <-a.q:
		return p
	default:
		return nil
	}
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
	pc, _ := cl.Net.Conn.(*protoConn)
	var run []*pendingAck
	var next *pendingAck // taken from the queue, not durable yet
	for {
		p := next
		if p == nil {
			var ok bool
			if p, ok = <-a.q; !ok {
				return
			}
		}
		p.err = p.durable.Wait() // nothing is held here
		run, next = append(run[:0], p), nil
		for len(run) < ackerRun {
			q := a.poll()
			if q == nil {
				break
			}
			if !q.durable.Ready() {
				next = q
				break
			}
			q.err = q.durable.Wait() // answered already, or as the committer answers its transaction
			run = append(run, q)
		}
		held := len(run) > 1 && pc != nil && pc.hold()
		for _, p := range run {
			h.ackForwarded(cl, p.pk, p.props, p.err)
		}
		if held {
			_ = pc.flush() // a failure ends the connection, as mochi's own would
		}
		for i, p := range run {
			if p.err == nil {
				h.publishLocal(cl, p.pk)
			}
			run[i] = nil
			a.pending.Done()
		}
	}
}

// ackForwarded acknowledges a queued publish: durable, it is counted
// allowed and acknowledged (if the connection is still there; it is
// forwarded upstream either way), and then published locally by the
// caller; otherwise counted dropped and not acknowledged, so the device
// sends it again.
func (h *throttle) ackForwarded(cl *mqtt.Client, pk packets.Packet, props []packets.UserProperty, err error) {
	if err != nil {
		h.dropped.Add(1)
		if h.logs.allow(logForward, "", refusalLogWindow) {
			h.log.Error("message not acknowledged: the forward log did not take it", "client", cl.ID, "topic", pk.TopicName, "error", err)
		}
		return
	}
	h.allowed.Add(1)
	_ = cl.WritePacket(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: pk.PacketID,
		Properties: packets.Properties{User: props}, Origin: ackerOrigin})
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
