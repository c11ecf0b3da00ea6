package broker

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt3 "github.com/eclipse/paho.mqtt.golang"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/forward"
	"github.com/devicegate/devicegate/persist"
)

// diskGate is a real store's free-space probe (persist.Options.DiskFree
// with a floor), which the group commit asks before every commit that
// writes records: while the gate is shut, a commit waits in it, as
// behind a slow fsync, its batch taken and the next queueing behind it.
type diskGate struct {
	mu      sync.Mutex
	cond    *sync.Cond
	shut    bool
	passes  int // commits let through while shut
	entered int // commits that asked
}

func newDiskGate() *diskGate {
	g := &diskGate{}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (g *diskGate) free(string) (int64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.entered++
	for g.shut && g.passes == 0 {
		g.cond.Wait()
	}
	if g.shut {
		g.passes--
	}
	return 1 << 50, true
}

func (g *diskGate) set(shut bool) {
	g.mu.Lock()
	g.shut = shut
	g.cond.Broadcast()
	g.mu.Unlock()
}

// pass lets one commit through the shut gate.
func (g *diskGate) pass() {
	g.mu.Lock()
	g.passes++
	g.cond.Broadcast()
	g.mu.Unlock()
}

func (g *diskGate) asked() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.entered
}

// countedLog is the real store, counting the appends queued.
type countedLog struct {
	*persist.Store
	appends atomic.Int64
}

func (l *countedLog) AppendForwardAsync(log string, seq uint64, rec []byte) (persist.Queued, error) {
	q, err := l.Store.AppendForwardAsync(log, seq, rec)
	l.appends.Add(1)
	return q, err
}

// writeLog is a client connection's socket (under TLS or WebSocket
// framing, the bytes mochi writes), recording every write.
type writeLog struct {
	net.Conn
	mu     sync.Mutex
	writes [][]byte
}

func (w *writeLog) Write(b []byte) (int, error) {
	w.mu.Lock()
	w.writes = append(w.writes, bytes.Clone(b))
	w.mu.Unlock()
	return w.Conn.Write(b)
}

// CloseWrite half-closes the socket under it (protoConn.CloseWrite).
func (w *writeLog) CloseWrite() error { return w.Conn.(*net.TCPConn).CloseWrite() }

// pubacks parses what was written and returns the PUBACKs' packet IDs
// in order, and how many writes carried them.
func (w *writeLog) pubacks(t *testing.T) (ids []uint16, writes int) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var stream []byte
	var starts []int // the write each byte of stream came in
	for i, b := range w.writes {
		stream = append(stream, b...)
		for range b {
			starts = append(starts, i)
		}
	}
	carried := map[int]bool{}
	for at := 0; at < len(stream); {
		end := packetEnd(stream, at)
		if end > len(stream) {
			t.Fatalf("a packet of type %d cut short at byte %d of %d", stream[at]>>4, at, len(stream))
		}
		if stream[at]>>4 == packets.Puback { // a one-byte remaining length, then the packet ID
			ids = append(ids, uint16(stream[at+2])<<8|uint16(stream[at+3]))
			carried[starts[at]] = true
		}
		at = end
	}
	return ids, len(carried)
}

// ackFixture is a broker forwarding devices/# into a real forward log
// (bbolt in a temporary directory) whose commits a diskGate holds, and
// whose client dev-1's socket writes are recorded.
type ackFixture struct {
	*fixture
	gate *diskGate
	log  *countedLog
	hook *writeHook
}

// writeHook records the socket writes of one client (installed before
// its CONNACK, as the consumers' spool is) and the packet IDs of the
// PUBLISH packets mochi read from it, in order.
type writeHook struct {
	mqtt.HookBase
	id    string
	conns chan *writeLog
	mu    sync.Mutex
	read  []uint16
}

func (h *writeHook) ID() string { return "test-write-log" }

func (h *writeHook) Provides(b byte) bool {
	return b == mqtt.OnSessionEstablish || b == mqtt.OnPacketRead
}

func (h *writeHook) OnSessionEstablish(cl *mqtt.Client, _ packets.Packet) {
	if cl.ID != h.id {
		return
	}
	pc := cl.Net.Conn.(*protoConn)
	w := &writeLog{Conn: pc.Conn}
	pc.Conn = w // nothing else writes to it before the CONNACK
	h.conns <- w
}

func (h *writeHook) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.ID == h.id && pk.FixedHeader.Type == packets.Publish {
		h.mu.Lock()
		h.read = append(h.read, pk.PacketID)
		h.mu.Unlock()
	}
	return pk, nil
}

func (h *writeHook) publishesRead() []uint16 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.read)
}

func startAckFixture(t *testing.T, options func(*Options)) *ackFixture {
	t.Helper()
	gate := newDiskGate()
	st, err := persist.Open(t.TempDir(), persist.Options{MinFreeBytes: 1, DiskFree: gate.free})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	gate.mu.Lock()
	gate.entered = 0 // Open's own
	gate.mu.Unlock()
	log := &countedLog{Store: st}
	fw, err := forward.New(forward.Config{Name: "up/0", Dial: &forward.MQTT{Address: "127.0.0.1:1", ClientID: "gw"}, MaxQoS: 1}, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Not started: the messages stay in the log, nothing is dialled.
	set := forward.NewSet([]forward.Route{{Filters: []string{"devices/#"}, Conns: []*forward.Forwarder{fw}}})
	f := start(t, fixtureOpts{options: func(o *Options) {
		o.Forward = set
		// A local subscriber's queue takes a whole burst: these tests
		// are about order, not slow subscribers.
		o.Limits.MaxPendingWrites = 1024
		if options != nil {
			options(o)
		}
	}})
	t.Cleanup(func() { gate.set(false) }) // before the broker's Close, which waits for the ackers
	hook := &writeHook{id: "dev-1", conns: make(chan *writeLog, 1)}
	if err := f.srv.mqtt.AddHook(hook, nil); err != nil {
		t.Fatal(err)
	}
	return &ackFixture{fixture: f, gate: gate, log: log, hook: hook}
}

// connect3 connects dev-1, an MQTT 3.1.1 client (paho.mqtt.golang: one
// writer goroutine, so its packets never interleave on a TLS or
// WebSocket connection, which paho.golang's publishes from several
// goroutines can), over conn.
func connect3(t *testing.T, conn net.Conn) mqtt3.Client {
	t.Helper()
	c := mqtt3.NewClient(mqtt3.NewClientOptions().AddBroker("tcp://127.0.0.1:1").SetClientID("dev-1").SetProtocolVersion(4).
		SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(waitTimeout).SetKeepAlive(time.Hour).
		SetCustomOpenConnectionFn(func(*url.URL, mqtt3.ClientOptions) (net.Conn, error) { return conn, nil }))
	if tok := c.Connect(); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		t.Fatalf("connect dev-1: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(0) })
	return c
}

// publishAll sends payloads as QoS 1 publishes of dev-1, in order, all
// in flight at once, and returns the channel each one's outcome arrives
// on: its payload once acknowledged, or an error.
func publishAll(c mqtt3.Client, payloads ...string) <-chan string {
	out := make(chan string, len(payloads))
	for _, pl := range payloads {
		tok := c.Publish("devices/dev-1/t", 1, false, pl)
		go func() {
			switch {
			case !tok.WaitTimeout(waitTimeout):
				out <- "publish " + pl + ": no PUBACK"
			case tok.Error() != nil:
				out <- fmt.Sprintf("publish %s: %v", pl, tok.Error())
			default:
				out <- pl
			}
		}()
	}
	return out
}

// acked waits for n outcomes and returns the payloads acknowledged.
func acked(t *testing.T, out <-chan string, n int) []string {
	t.Helper()
	var got []string
	for range n {
		v := receive(t, "a PUBACK", out)
		if _, err := strconv.Atoi(v); err != nil {
			t.Fatal(v)
		}
		got = append(got, v)
	}
	slices.SortFunc(got, func(a, b string) int { x, _ := strconv.Atoi(a); y, _ := strconv.Atoi(b); return x - y })
	return got
}

func numbers(from, to int) []string {
	var s []string
	for i := from; i <= to; i++ {
		s = append(s, strconv.Itoa(i))
	}
	return s
}

// TestForwardAcksCoalesced: a device's many QoS 1 publishes in flight,
// made durable by two commits, get their PUBACKs in a few writes (one
// per ackerRun at most, and one per commit), in the order the publishes
// came, and a local subscriber gets them in that order; over TCP, TLS,
// WebSocket and WebSocket over TLS. Before, the acker wrote each PUBACK
// with a write of its own: 200 writes for 200. A backend consumer's
// connection holds nothing (its spool writes what is pending in one
// call): its PUBACKs and the deliveries keep their order all the same.
func TestForwardAcksCoalesced(t *testing.T) {
	const n = 200 // below ackerQueue: the reader never waits for the acker
	ca := newCA(t, "ack-ca")
	tlsCfg := serverTLS(t, ca, false)
	for _, tc := range []struct {
		name string
		opts func(*Options)
		dial func(t *testing.T, f *fixture) net.Conn
	}{
		{"tcp", nil, func(t *testing.T, f *fixture) net.Conn { return dialTCP(t, f.addr) }},
		{"consumers", func(o *Options) { o.Limits.Consumers = []string{"dev-1", "sub-1"} }, func(t *testing.T, f *fixture) net.Conn {
			return dialTCP(t, f.addr)
		}},
		{"tls", func(o *Options) { o.TLSAddr, o.TLS = "127.0.0.1:0", tlsCfg }, func(t *testing.T, f *fixture) net.Conn {
			c, err := dialTLS(t, f.srv.TLSAddr().String(), clientTLS(ca))
			if err != nil {
				t.Fatal(err)
			}
			return c
		}},
		{"ws", func(o *Options) { o.WebSocketAddr = "127.0.0.1:0" }, func(t *testing.T, f *fixture) net.Conn {
			return dialWS(t, f.srv.WebSocketAddr().String())
		}},
		{"wss", func(o *Options) { o.WebSocketAddr, o.WebSocketTLS, o.TLS = "127.0.0.1:0", true, tlsCfg }, func(t *testing.T, f *fixture) net.Conn {
			c, err := dialWSS(t, f.srv.WebSocketAddr().String(), clientTLS(ca))
			if err != nil {
				t.Fatal(err)
			}
			return c
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startAckFixture(t, tc.opts)
			sub := f.subscribe(t, "sub-1", "", "devices/#")
			dev := connect3(t, tc.dial(t, f.fixture))
			w := receive(t, "dev-1's connection", f.hook.conns)

			f.gate.set(true)
			// The first commit waits in the gate with 1 alone; 2 to n,
			// all queued meanwhile, make up the next. (Publishing all
			// at once left it to the scheduler whether the first commit
			// began before the rest were queued: one commit or two.)
			first := publishAll(dev, "1")
			eventually(t, "the first commit in the gate", func() bool { return f.gate.asked() == 1 && f.log.appends.Load() == 1 })
			out := publishAll(dev, numbers(2, n)...)
			eventually(t, "every publish queued for the commit", func() bool { return f.log.appends.Load() == n })
			f.gate.set(false)
			if got := append(acked(t, first, 1), acked(t, out, n-1)...); !slices.Equal(got, numbers(1, n)) {
				t.Fatalf("acknowledged %v", got)
			}
			eventually(t, "every message delivered locally", func() bool { return len(sub.payloads()) == n })
			if got := sub.payloads(); !slices.Equal(got, numbers(1, n)) {
				t.Fatalf("the local subscriber got %v", got)
			}
			if commits := f.gate.asked(); commits != 2 {
				t.Fatalf("%d commits, want 2 (the test's premise)", commits)
			}
			ids, writes := w.pubacks(t)
			if tc.name == "consumers" {
				// The spool took the writes before the test's log did.
				if len(ids) != 0 {
					t.Fatalf("PUBACKs %v past the spool", ids)
				}
				return
			}
			if read := f.hook.publishesRead(); !slices.Equal(ids, read) {
				t.Fatalf("PUBACKs in the order %v, publishes read in the order %v", ids, read)
			}
			// Two commits, runs of ackerRun; one more should the last
			// publish reach the acker after it looked.
			if limit := min(2+n/ackerRun+1, n/10); writes > limit {
				t.Fatalf("%d PUBACKs in %d writes, want at most %d", len(ids), writes, limit)
			}
			t.Logf("%d PUBACKs in %d writes", len(ids), writes)
		})
	}
}

// TestForwardAckNotHeldBehindCommit: PUBACKs whose messages are durable
// leave while a later publish of the same device waits for its commit:
// a run of them held to be written together is written before the acker
// waits. Three commits: [1], [2..5], [6..8]; with the third held, 1 to
// 5 are acknowledged (2 to 5 in one write), 6 to 8 once it ends.
func TestForwardAckNotHeldBehindCommit(t *testing.T) {
	f := startAckFixture(t, nil)
	dev := connect3(t, dialTCP(t, f.addr))
	w := receive(t, "dev-1's connection", f.hook.conns)

	f.gate.set(true)
	out := publishAll(dev, "1")
	eventually(t, "the first commit in the gate", func() bool { return f.gate.asked() == 1 && f.log.appends.Load() == 1 })
	second := publishAll(dev, numbers(2, 5)...)
	eventually(t, "2 to 5 queued", func() bool { return f.log.appends.Load() == 5 })
	f.gate.pass() // [1]; [2..5] waits in the gate
	if got := acked(t, out, 1); !slices.Equal(got, []string{"1"}) {
		t.Fatalf("acknowledged %v", got)
	}
	eventually(t, "the second commit in the gate", func() bool { return f.gate.asked() == 2 })
	third := publishAll(dev, numbers(6, 8)...)
	eventually(t, "6 to 8 queued", func() bool { return f.log.appends.Load() == 8 })
	f.gate.pass() // [2..5]; [6..8] waits in the gate
	if got := acked(t, second, 4); !slices.Equal(got, numbers(2, 5)) {
		t.Fatalf("acknowledged %v while 6 to 8 wait for their commit, want 2 to 5", got)
	}
	eventually(t, "the third commit in the gate", func() bool { return f.gate.asked() == 3 })
	select {
	case v := <-third:
		t.Fatalf("%s acknowledged before its commit", v)
	default:
	}
	ids, writes := w.pubacks(t)
	if read := f.hook.publishesRead()[:5]; !slices.Equal(ids, read) || writes != 2 {
		t.Fatalf("PUBACKs %v in %d writes, want %v in 2 ([1], [2..5])", ids, writes, read)
	}

	f.gate.set(false)
	if got := acked(t, third, 3); !slices.Equal(got, numbers(6, 8)) {
		t.Fatalf("acknowledged %v", got)
	}
	if ids, _ := w.pubacks(t); !slices.Equal(ids, f.hook.publishesRead()) {
		t.Fatalf("PUBACKs in the order %v, publishes read in the order %v", ids, f.hook.publishesRead())
	}
}
