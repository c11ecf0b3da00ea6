package broker

import (
	"net"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/loopback"
	"github.com/devicegate/devicegate/internal/poll"
	"github.com/devicegate/devicegate/internal/spool"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"
)

// TestOutboundQueueProbe: the consumers' view of mochi's outbound queue
// is the real one. A consumer with a 1 KiB spool that reads nothing: its
// queue fills to MaxPendingWrites, and the probe sees it full. A client
// whose ID no glob matches gets no spool; a consumer that leaves is
// forgotten. Fails when a mochi upgrade renames or retypes the field.
func TestOutboundQueueProbe(t *testing.T) {
	if outboundField == nil {
		t.Fatal("mochi's ClientState has no outbound channel: consumers cannot watch their queues")
	}
	const pending = 32
	f, _, ctx := startLogged(t, Limits{Consumers: []string{"backend-*"}, ConsumerWriteBuffer: 1024, MaxPendingWrites: pending})
	sub := rawSubscriber(t, f.addr, "backend-1", "devices/#")
	rawSubscriber(t, f.addr, "device-7", "devices/#")

	online := f.srv.auth.consumers.online.Load()
	if online == nil || len(*online) != 1 {
		t.Fatalf("online consumers: %v, want backend-1 alone", online)
	}
	c := (*online)[0]
	if cap(c.queue) != pending {
		t.Fatalf("probed queue capacity %d, want %d", cap(c.queue), pending)
	}
	pub := f.dial5(t, "meter-1", "", nil)
	payload := make([]byte, 64<<10)
	for range 400 { // 25 MiB: more than the sockets, the spool and the queue hold
		if _, err := pub.Publish(ctx, &paho.Publish{Topic: "devices/meter-1", QoS: 0, Payload: payload}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "a full queue seen by the probe", func() bool { return len(c.queue) == pending })
	if st := f.srv.AuthStats(); st.ConsumersSpooled != 1 {
		t.Fatalf("%d connections spooled, want 1 (device-7 is no consumer)", st.ConsumersSpooled)
	}
	sub.Close()
	eventually(t, "the consumer forgotten once gone", func() bool { return len(*f.srv.auth.consumers.online.Load()) == 0 })
}

// TestGateAllocatesNothing: with a consumer online, an allowed publish
// passes the gate and leaves it at OnPublished without allocating, and
// leaves the gate as it found it.
func TestGateAllocatesNothing(t *testing.T) {
	s, cl, pk := newHookClient(t, devicelimit.Quota{Limit: devicelimit.MaxLimit, Window: time.Second})
	near, far := net.Pipe()
	t.Cleanup(func() { near.Close(); far.Close() })
	cs := newConsumerSet(Limits{Consumers: []string{"backend-*"}})
	c := &consumer{queue: make(chan *packets.Packet, 64), spool: spool.New(far, 1<<20, nil, nil)}
	cs.online.Store(&[]*consumer{c})
	s.hook.consumers, s.auth.consumers = cs, cs
	cl.Net.Conn = &protoConn{Conn: near}
	checkAllowedPublishAllocs(t, s, cl, pk)
	s.auth.OnPublished(cl, pk)
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := s.hook.OnPublish(cl, pk); err != nil {
			t.Fatal(err)
		}
		s.auth.OnPublished(cl, pk)
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per publish through the gate, want 0", allocs)
	}
	if n := cs.inflight.Load(); n != 0 {
		t.Fatalf("%d deliveries left in the gate", n)
	}
	if cs.waits.Load() != 0 {
		t.Fatal("a publish waited with the consumer's queue empty")
	}
}

// TestGateWaitsForRoom: a publish waits at the gate while a consumer's
// queue is full, goes on when the writer makes room, and goes on at once
// when the consumer leaves (not after consumerWait).
func TestGateWaitsForRoom(t *testing.T) {
	_, cl, _ := newHookClient(t, devicelimit.Quota{Limit: devicelimit.MaxLimit, Window: time.Second})
	near, far := net.Pipe()
	t.Cleanup(func() { near.Close(); far.Close() })
	cl.Net.Conn = &protoConn{Conn: near}
	cs := newConsumerSet(Limits{Consumers: []string{"backend-*"}})
	c, queue, write := stalledConsumer(t, cs, 4)

	passed := make(chan struct{})
	go func() {
		cs.enter(cl)
		close(passed)
	}()
	poll.Until(t, waitTimeout, "a publish at the gate", func() bool { return cs.waits.Load() == 1 })
	select {
	case <-passed:
		t.Fatal("the publish passed a full queue")
	default:
	}
	write()
	<-passed
	if n := cs.inflight.Load(); n != 1 {
		t.Fatalf("inflight %d after the publish passed, want 1", n)
	}
	cl.Net.Conn.(*protoConn).leave()

	queue <- &packets.Packet{} // full again
	again := make(chan struct{})
	go func() {
		cs.enter(cl)
		close(again)
	}()
	poll.Until(t, waitTimeout, "a second publish at the gate", func() bool { return cs.waits.Load() == 2 })
	cs.remove(c)
	select {
	case <-again:
	case <-time.After(consumerWait / 2):
		t.Fatal("the publish still waited for a consumer that had left")
	}
}

// TestGateHoldsReleases: a release round publishing a deferred message
// waits at the gate while a consumer's queue is full, and releases it
// once the consumer's writer makes room.
func TestGateHoldsReleases(t *testing.T) {
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{deferRule("dev-*", 1, time.Second)}, store: openStore(t, t.TempDir())})
	p := f.connect(t, 5, "dev-1", "")
	for _, m := range []string{"m0", "m1"} {
		if code := publish5(t, p, &paho.Publish{Topic: "t/a", QoS: 1, Payload: []byte(m)}); code != 0 {
			t.Fatalf("publish %s: 0x%02x", m, code)
		}
	}
	if st := f.srv.Stats(); st.Deferred != 1 {
		t.Fatalf("stats %+v, want m1 deferred", st)
	}
	cs := newConsumerSet(Limits{Consumers: []string{"backend-*"}})
	_, _, write := stalledConsumer(t, cs, 2)
	f.srv.hook.consumers = cs // before the release round's goroutine starts

	done := make(chan struct{})
	go func() {
		f.srv.releaseTick(f.clock.Advance(2 * time.Second))
		close(done)
	}()
	poll.Until(t, waitTimeout, "the release at the gate", func() bool { return cs.waits.Load() == 1 })
	if st := f.srv.Stats(); st.Released != 0 {
		t.Fatalf("released %d past a full queue", st.Released)
	}
	write()
	<-done
	if st := f.srv.Stats(); st.Released != 1 || cs.inflight.Load() != 0 {
		t.Fatalf("released %d, inflight %d; want 1 and 0", st.Released, cs.inflight.Load())
	}
}

// TestGateHoldsWillsAndCommands: the broker's other deliveries wait at
// the gate too while a consumer's queue is full: a will published as a
// device is disconnected (a mass disconnect is a burst of them), and a
// command from an upstream's subscribe: (Server.Publish). Each goes on
// once the consumer's writer makes room, and leaves the gate empty.
func TestGateHoldsWillsAndCommands(t *testing.T) {
	t.Run("will", func(t *testing.T) {
		f := start(t, fixtureOpts{rules: []devicelimit.Rule{rule("dev-*", 1, devicelimit.PolicyDisconnect)}, options: withConsumers})
		sub := f.subscribe(t, "sub", "", "status/#")
		p := f.connectWithWill(t, 5, "dev-1", "status/dev-1", "offline")
		if a, err := p.publish(t, "t/dev-1", "ok", 1); err != nil || a.code != 0 {
			t.Fatalf("publish: 0x%02x, %v", a.code, err)
		}
		cs := f.srv.hook.consumers
		_, _, write := stalledConsumer(t, cs, 2)
		p.send("t/dev-1", "over", 1) // over the quota: disconnected, will published
		poll.Until(t, waitTimeout, "the will at the gate", func() bool { return cs.waits.Load() == 1 })
		if sub.has("offline") {
			t.Fatal("the will passed a full queue")
		}
		write()
		eventually(t, "the will, and the gate empty", func() bool { return sub.has("offline") && cs.inflight.Load() == 0 })
	})
	t.Run("command", func(t *testing.T) {
		f := start(t, fixtureOpts{options: withConsumers})
		sub := f.subscribe(t, "dev-1", "", "commands/dev-1")
		cs := f.srv.hook.consumers
		_, _, write := stalledConsumer(t, cs, 2)
		done := make(chan error, 1)
		go func() { done <- f.srv.Publish("commands/dev-1", []byte("reboot"), false, 1) }()
		poll.Until(t, waitTimeout, "the command at the gate", func() bool { return cs.waits.Load() == 1 })
		select {
		case err := <-done:
			t.Fatalf("the command passed a full queue (%v)", err)
		default:
		}
		write()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		eventually(t, "the command", func() bool { return sub.has("reboot") })
		if n := cs.inflight.Load(); n != 0 {
			t.Fatalf("%d deliveries left in the gate", n)
		}
	})
}

// withConsumers names backend-* the broker's consumers.
func withConsumers(o *Options) { o.Limits.Consumers = []string{"backend-*"} }

// stalledConsumer puts online in cs a consumer whose queue of n slots is
// full, and returns it with write, which does what the consumer's
// writer does: takes one message off the queue and writes it (waking a
// publish at the gate).
func stalledConsumer(t *testing.T, cs *consumerSet, n int) (c *consumer, queue chan *packets.Packet, write func()) {
	t.Helper()
	queue = make(chan *packets.Packet, n)
	for range n {
		queue <- &packets.Packet{}
	}
	sink, _ := loopback.Pair(t)
	c = &consumer{queue: queue, spool: spool.New(sink, 1<<20, cs.notify, nil)}
	cs.online.Store(&[]*consumer{c})
	write = func() {
		<-queue
		if _, err := c.spool.Write([]byte{0x30, 0}); err != nil {
			t.Error(err)
		}
	}
	return c, queue, write
}
