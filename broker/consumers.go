package broker

import (
	"reflect"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/spool"
)

// Backend consumers (Limits.Consumers) are the few clients that
// subscribe to what many devices publish. mochi gives every client one
// outbound queue of Limits.MaxPendingWrites messages, allocated whole at
// accept, so a queue deep enough for a consumer would cost every idle
// device as much. Instead the queue stays small and a consumer gets two
// things:
//
//   - a write spool (internal/spool): mochi's writer copies packets and
//     returns, so a consumer that reads in bursts or stalls for a moment
//     has the spool's bytes of slack instead of the queue's messages;
//   - a gate before delivery: a device's publish, once the throttle has
//     admitted it, enters delivery only while every consumer's queue has
//     room for it and for every other publish being delivered at that
//     moment (inflight); otherwise it waits, consumerWait at most, for a
//     consumer's writer to write or a delivery to end. On two cores the
//     readers of fifty publishers otherwise overrun a 64-slot queue
//     while the consumer's writer waits for a processor, however fast it
//     writes (broker.TestConsumerQueueAccounting, and
//     server.TestConsumersKeepUp: 0.5 % lost with a check made after
//     delivery, where every waiter woken at once delivers one more).
//     The publishers' readers stop meanwhile, so devices feel it as TCP
//     back-pressure, not as loss. A consumer whose spool is half full is
//     slow, not starved, and is not waited for: messages beyond its
//     queue are dropped and counted like any slow subscriber's.
//
// A publish takes its place in inflight as the throttle admits it and
// leaves it at OnPublished, or, should mochi not deliver it after all
// (a PUBACK that cannot be written, which ends the connection), at the
// client's next publish or the end of its connection
// (protoConn.delivering). Deliveries the broker
// makes itself (released deferred messages, forwarded messages
// acknowledged upstream, messages from an upstream's subscribe:) pass
// the gate around their synchronous InjectPacket or Publish; a will
// published at once passes it between OnWill and OnWillSent (will.go).
// Only a delayed will, which mochi's loop publishes past every hook,
// does not.
//
// The queue is found with reflect: mochi keeps the channel in an
// unexported field (ClientState.outbound) and has no accessor. The
// channel is taken out of the field once, at attach (through its
// address: reflect refuses to hand out an unexported field's value), and
// only its length and capacity are read, which is safe from any
// goroutine. Reading them through reflect.Value cost about 600
// instructions a message with five consumers (callgrind, bench/harness's
// consumers), a plain len and cap a few. Should a mochi upgrade rename
// or retype the field, consumers are refused at New (Limits.validate)
// and TestOutboundQueueProbe fails.

// outboundField is the index of mochi's outbound queue in
// mqtt.ClientState, nil when this mochi has no such channel of
// *packets.Packet.
var outboundField = func() []int {
	f, ok := reflect.TypeFor[mqtt.ClientState]().FieldByName("outbound")
	if !ok || f.Type != reflect.TypeFor[chan *packets.Packet]() {
		return nil
	}
	return f.Index
}()

// outboundOf returns cl's outbound queue (outboundField not nil).
func outboundOf(cl *mqtt.Client) chan *packets.Packet {
	f := reflect.ValueOf(&cl.State).Elem().FieldByIndex(outboundField)
	return *(*chan *packets.Packet)(unsafe.Pointer(f.UnsafeAddr()))
}

// consumerWait bounds how long one publish waits at the gate. A
// consumer's writer that has room in its spool never blocks, so a wait
// is for a processor; on a loaded machine (the race detector, tests in
// parallel) that took over 100 ms.
const consumerWait = time.Second

// consumer is a connected backend consumer.
type consumer struct {
	queue chan *packets.Packet // the client's outbound channel: len and cap only
	spool *spool.Writer
}

// fits reports whether the consumer's queue has room for n more
// messages, or its spool is half full (a slow consumer, not waited for).
func (c *consumer) fits(n int64) bool {
	return int64(len(c.queue))+n <= int64(cap(c.queue)) || c.spool.Pending() >= c.spool.Limit()/2
}

// consumerSet holds the consumer globs and the connected consumers.
// With no glob, nobody is a consumer and the gate lets every publish by.
type consumerSet struct {
	// rules are the globs and spool size in force, read at each
	// CONNECT: Limits', or the latest SetLimits'. A client is a consumer
	// or not for the whole of a connection.
	rules atomic.Pointer[consumerRules]

	mu     sync.Mutex                  // serializes changes of online
	online atomic.Pointer[[]*consumer] // copied on change, read per publish
	// inflight counts the publishes admitted to delivery and not yet
	// delivered.
	inflight atomic.Int64
	// wake holds one token, put by a consumer's writer as it writes
	// (slots freed), taken by one publish at the gate: one is woken per
	// write, not all of them, so the writer is not crowded off the
	// processor by publishes that look and wait again. A publish that
	// gets in with room to spare passes the token on.
	wake chan struct{}

	spooled atomic.Uint64 // connections given a spool
	waits   atomic.Uint64 // publishes that waited at the gate
	expired atomic.Uint64 // of them, those that went on at consumerWait
}

// consumerRules are the consumers' globs and each spool's limit.
type consumerRules struct {
	globs []devicelimit.Glob
	bytes int
}

// newConsumerSet compiles the globs of Limits.Consumers (validated).
func newConsumerSet(l Limits) *consumerSet {
	cs := &consumerSet{wake: make(chan struct{}, 1)}
	cs.setRules(l)
	return cs
}

// setRules puts the globs and spool size of l (validated) in force for
// the connections that come after.
func (cs *consumerSet) setRules(l Limits) {
	r := &consumerRules{bytes: l.ConsumerWriteBuffer}
	if r.bytes == 0 {
		r.bytes = DefaultConsumerWriteBuffer
	}
	for _, p := range l.Consumers {
		g, _ := devicelimit.CompileGlob(p)
		r.globs = append(r.globs, g)
	}
	cs.rules.Store(r)
}

// attach gives an admitted client a spool when its client ID is a
// consumer's.
func (cs *consumerSet) attach(cl *mqtt.Client) {
	r := cs.rules.Load()
	pc, ok := cl.Net.Conn.(*protoConn)
	if !ok || !r.matches(cl.ID) {
		return
	}
	c := &consumer{queue: outboundOf(cl)}
	c.spool = pc.startSpool(r.bytes, cs.notify, func() { cs.remove(c) })
	cs.spooled.Add(1)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	next := []*consumer{c}
	if old := cs.online.Load(); old != nil {
		next = append(next, *old...)
	}
	cs.online.Store(&next)
}

func (r *consumerRules) matches(id string) bool {
	for _, g := range r.globs {
		if g.Match(id) {
			return true
		}
	}
	return false
}

// remove forgets a consumer whose connection has ended.
func (cs *consumerSet) remove(c *consumer) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	old := *cs.online.Load()
	next := make([]*consumer, 0, len(old))
	for _, o := range old {
		if o != c {
			next = append(next, o)
		}
	}
	cs.online.Store(&next)
	cs.notify() // publishes waiting for it go on
}

// spoolBytes returns what the connected consumers' spools hold.
func (cs *consumerSet) spoolBytes() int64 {
	var n int64
	if online := cs.online.Load(); online != nil {
		for _, c := range *online {
			n += int64(c.spool.Pending())
		}
	}
	return n
}

// notify wakes one publish at the gate, if any waits.
func (cs *consumerSet) notify() {
	select {
	case cs.wake <- struct{}{}:
	default:
	}
}

// fitsAll reports whether every consumer has room for n more messages.
func fitsAll(online []*consumer, n int64) bool {
	for _, c := range online {
		if !c.fits(n) {
			return false
		}
	}
	return true
}

// enter admits the publish cl is about to have delivered, once every
// consumer has room for it (or after consumerWait); OnPublished, or
// cl's next publish, ends it. A nil set, and a client without a
// protoConn (mochi's own), pass.
func (cs *consumerSet) enter(cl *mqtt.Client) {
	pc, ok := cl.Net.Conn.(*protoConn)
	if !ok {
		return
	}
	pc.leave() // a publish mochi did not deliver
	if cs.acquire() {
		pc.delivering = cs
	}
}

// acquire takes a place among the deliveries (inflight) once every
// consumer has room for it, or after consumerWait. It reports whether it
// took one, which done gives back; with no consumer online (or a nil
// set) it takes none.
func (cs *consumerSet) acquire() bool {
	if cs == nil {
		return false
	}
	online := cs.online.Load()
	if online == nil || len(*online) == 0 {
		return false
	}
	if fitsAll(*online, cs.inflight.Add(1)) {
		return true
	}
	cs.inflight.Add(-1)
	cs.waits.Add(1)
	deadline := time.NewTimer(consumerWait)
	defer deadline.Stop()
	for {
		select {
		case <-cs.wake:
		case <-deadline.C:
			cs.expired.Add(1)
			cs.inflight.Add(1)
			return true
		}
		online = cs.online.Load()
		n := cs.inflight.Add(1)
		if fitsAll(*online, n) {
			if fitsAll(*online, n+1) {
				cs.notify() // room for the next one too
			}
			return true
		}
		cs.inflight.Add(-1)
	}
}

// done ends a delivery acquire admitted. It wakes no one: the message
// moved from inflight to a queue, which leaves the room as it was.
func (cs *consumerSet) done() { cs.inflight.Add(-1) }

// OnPublished runs on the publisher's goroutine once a message has been
// handed to its subscribers' queues: its delivery is done.
func (h *authHook) OnPublished(cl *mqtt.Client, _ packets.Packet) {
	if pc, ok := cl.Net.Conn.(*protoConn); ok {
		pc.leave()
	}
}
