package server

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/forward"
	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/mqtttest"
	"github.com/devicegate/devicegate/internal/poll"
)

// A device that moves between two gateways of a cluster (owner mode,
// the default) while both forward its messages to one real Mosquitto:
// its QoS 1 publishes pipelined on gateway A, it connects with the same
// client ID to gateway B mid-stream (A closes its old connection) and
// goes on there from the first number A did not acknowledge.

const (
	moveDevice = "meter-1"
	moveTopic  = "devices/meter-1/t"
	moveToken  = "test-token"
	// moveInflight is how many QoS 1 publishes the device keeps in
	// flight.
	moveInflight = 8
)

// moveCluster is a redis-server and a Mosquitto upstream that the
// gateways of a test share, and what arrived upstream.
type moveCluster struct {
	redis string
	up    *mosquittotest.Server
	mu    sync.Mutex
	got   []upMsg // in arrival order
}

// upMsg is a message as the upstream subscriber got it: its payload
// (the device's number) and the origin (the sending gateway's data
// file) and sequence of its devicegate-id.
type upMsg struct {
	n      int
	origin string
	seq    uint64
}

func newMoveCluster(t *testing.T, upOpts mosquittotest.Options) *moveCluster {
	c := &moveCluster{redis: redistest.Start(t).Addr, up: mosquittotest.StartWith(t, upOpts)}
	mqtttest.Subscribe5(t, c.up.Addr, "backend", paho.SubscribeOptions{Topic: "devices/#", QoS: 1}, func(p *paho.Publish) {
		n, err := strconv.Atoi(string(p.Payload))
		if err != nil {
			t.Errorf("upstream got payload %q", p.Payload)
			return
		}
		var id string
		if p.Properties != nil {
			id = p.Properties.User.Get(forward.IDProperty)
		}
		parts := strings.Split(id, "/") // ORIGIN/UPSTREAM/CONNECTION/SEQ
		seq, err := strconv.ParseUint(parts[len(parts)-1], 10, 64)
		if len(parts) != 4 || err != nil {
			t.Errorf("upstream message %d has id %q", n, id)
			return
		}
		c.mu.Lock()
		c.got = append(c.got, upMsg{n: n, origin: parts[0], seq: seq})
		c.mu.Unlock()
	})
	return c
}

func (c *moveCluster) upstream() []upMsg {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

// config is a gateway of the cluster on dir: limit messages an hour
// per device (policy drop), forwarding devices/# over MQTT 5 under a
// client ID of its own (gateways of one host would otherwise share
// devicegate-HOST-NAME and take each other's upstream session over).
func (c *moveCluster) config(dir, name string, limit int) config.Config {
	cfg := testConfig(dir, limit, time.Hour)
	cfg.Admin.Token = moveToken
	cfg.Cluster.Redis.Addrs = []string{c.redis}
	cfg.Forward = []config.Forward{{Name: "cloud", To: "mqtt://" + c.up.Addr, Topics: []string{"devices/#"}, MaxQoS: 1,
		MQTTVersion: "5", ClientID: "devicegate-move-" + name}}
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	if cfg.Cluster.Decisions != "owner" {
		panic("cluster.decisions is not owner by default")
	}
	return cfg
}

// rawDevice is an MQTT 5 device on a raw connection: one goroutine
// writes its publishes in order, up to moveInflight unanswered, and
// another reads the answers, so the test knows exactly which number got
// which PUBACK on which connection.
type rawDevice struct {
	conn net.Conn
	room chan struct{} // a token per publish that may be in flight
	lost chan struct{} // closed once the connection ended

	mu      sync.Mutex
	next    uint16
	byID    map[uint16]int // packet ID -> number, in flight
	answers map[int]byte   // number -> its PUBACK's reason code
	sent    []int
	reason  int // the server's DISCONNECT reason code, -1 for none
}

func dialRaw5(t *testing.T, addr, id string) *rawDevice {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cp := packets.NewControlPacket(packets.CONNECT)
	c := cp.Content.(*packets.Connect)
	c.ClientID, c.CleanStart, c.KeepAlive = id, true, 60
	if _, err := cp.WriteTo(conn); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	ack, err := packets.ReadPacket(conn)
	if err != nil {
		t.Fatalf("CONNACK of %s from %s: %v", id, addr, err)
	}
	if ca, ok := ack.Content.(*packets.Connack); !ok || ca.ReasonCode != 0 {
		t.Fatalf("CONNECT %s to %s answered %v", id, addr, ack)
	}
	_ = conn.SetReadDeadline(time.Time{})
	d := &rawDevice{conn: conn, room: make(chan struct{}, moveInflight), lost: make(chan struct{}),
		byID: map[uint16]int{}, answers: map[int]byte{}, reason: -1}
	for range moveInflight {
		d.room <- struct{}{}
	}
	go d.read()
	return d
}

func (d *rawDevice) read() {
	defer close(d.lost)
	defer d.conn.Close()
	for {
		cp, err := packets.ReadPacket(d.conn)
		if err != nil {
			return
		}
		switch p := cp.Content.(type) {
		case *packets.Puback:
			d.mu.Lock()
			n, ok := d.byID[p.PacketID]
			delete(d.byID, p.PacketID)
			if ok {
				d.answers[n] = p.ReasonCode
			}
			d.mu.Unlock()
			if ok {
				d.room <- struct{}{}
			}
		case *packets.Disconnect:
			d.mu.Lock()
			d.reason = int(p.ReasonCode)
			d.mu.Unlock()
		}
	}
}

// publish sends numbers from to last in order, keeping up to
// moveInflight unanswered, until all are sent or the connection ends;
// it returns once every publish sent is answered or the connection
// ended.
func (d *rawDevice) publish(t *testing.T, from, last int) {
	for n := from; n <= last; n++ {
		select {
		case <-d.room:
		case <-d.lost:
			return
		}
		cp := packets.NewControlPacket(packets.PUBLISH)
		p := cp.Content.(*packets.Publish)
		d.mu.Lock()
		d.next++
		if d.next == 0 {
			d.next = 1
		}
		p.PacketID = d.next
		d.byID[p.PacketID] = n
		d.sent = append(d.sent, n)
		d.mu.Unlock()
		p.Topic, p.QoS, p.Payload = moveTopic, 1, []byte(strconv.Itoa(n))
		if _, err := cp.WriteTo(d.conn); err != nil {
			return // the connection ended: the reader says so
		}
	}
	deadline := time.After(20 * time.Second)
	for range moveInflight {
		select {
		case tok := <-d.room:
			defer func() { d.room <- tok }()
		case <-d.lost:
			return
		case <-deadline:
			t.Errorf("publishes %v unanswered after 20s", d.inflight())
			return
		}
	}
}

func (d *rawDevice) inflight() []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ns []int
	for _, n := range d.byID {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	return ns
}

// result returns the reason code of each number answered, the numbers
// sent in order, and the server's DISCONNECT reason (-1 for none).
func (d *rawDevice) result() (map[int]byte, []int, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	answers := make(map[int]byte, len(d.answers))
	for n, c := range d.answers {
		answers[n] = c
	}
	return answers, slices.Clone(d.sent), d.reason
}

func (d *rawDevice) acked() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.answers)
}

// moveResult is what the device saw over the move.
type moveResult struct {
	onA, onB     map[int]byte // answers
	sentA, sentB []int
	first        int // the first number A did not answer: B's first
	inflight     int // sent to A, unanswered when A closed the connection
}

// move publishes 1..total as one device: on A until A has answered
// after of them, while it goes on publishing there, the device connects
// to B with the same client ID; A must close the old connection (with
// DISCONNECT 0x8E, session taken over), and the device goes on on B
// from the first number A did not answer.
func move(t *testing.T, a, b *Gateway, after, total int) moveResult {
	t.Helper()
	old := dialRaw5(t, a.Addr().String(), moveDevice)
	done := make(chan struct{})
	go func() {
		defer close(done)
		old.publish(t, 1, total)
	}()
	poll.Until(t, 20*time.Second, fmt.Sprintf("A to answer %d publishes", after), func() bool { return old.acked() >= after })
	moved := dialRaw5(t, b.Addr().String(), moveDevice)
	select {
	case <-old.lost:
	case <-time.After(20 * time.Second):
		t.Fatalf("the connection to A survived the device's connection to B")
	}
	<-done
	var r moveResult
	var reason int
	r.onA, r.sentA, reason = old.result()
	if reason != int(packets.DisconnectSessionTakenOver) {
		t.Errorf("A closed the old connection with DISCONNECT reason %d, want 0x8e (session taken over)", reason)
	}
	r.first = 1
	for hasKey(r.onA, r.first) {
		r.first++
	}
	for _, n := range r.sentA {
		if !hasKey(r.onA, n) {
			r.inflight++
		}
	}
	moved.publish(t, r.first, total)
	select {
	case <-moved.lost:
		t.Fatalf("the connection to B ended")
	default:
	}
	r.onB, r.sentB, _ = moved.result()
	return r
}

func hasKey(m map[int]byte, k int) bool { _, ok := m[k]; return ok }

// TestForwardDeviceMoves: the device above, with a quota of 60 an hour
// (policy drop) and 90 messages across both gateways. Upstream gets
// every message the device got a PUBACK for, from A (those acknowledged
// just before the takeover too) or B; nothing refused; a message twice
// at most for each publish in flight at the takeover; A's messages in
// the order A took them, B's in B's. Over both gateways at most 60 are
// admitted, and one session is left in the cluster: B's.
func TestForwardDeviceMoves(t *testing.T) {
	const limit, total = 60, 90
	c := newMoveCluster(t, mosquittotest.Options{})
	a := mustStart(t, c.config(t.TempDir(), "a", limit), Deps{})
	b := mustStart(t, c.config(t.TempDir(), "b", limit), Deps{})
	r := move(t, a, b, 10, total)
	c.check(t, r, limit, r.inflight, 0, a, b)
	for _, g := range []struct {
		name      string
		gw        *Gateway
		connected bool
	}{{"A", a, false}, {"B", b, true}} {
		body := httpGet(t, "http://"+g.gw.AdminAddr().String()+"/api/v1/devices/"+moveDevice, moveToken)
		if want := fmt.Sprintf(`"connected":%v`, g.connected); !strings.Contains(body, want) {
			t.Errorf("GET /api/v1/devices/%s on %s = %s, want %s", moveDevice, g.name, body, want)
		}
	}
}

// check waits until what the device got a PUBACK for is upstream and
// the forward logs of gws are empty, then checks what arrived against
// r: at most dupBound duplicates, and what the gateways admitted (gws'
// count and before) upstream.
func (c *moveCluster) check(t *testing.T, r moveResult, limit, dupBound int, before uint64, gws ...*Gateway) {
	t.Helper()
	acked := map[int]bool{}   // a PUBACK 0x00, from A or B
	maybe := map[int]bool{}   // sent to A, unanswered: A may have taken it
	refused := map[int]bool{} // 0x97, and never acknowledged
	successes := 0
	for _, answers := range []map[int]byte{r.onA, r.onB} {
		for n, code := range answers {
			switch code {
			case 0:
				acked[n] = true
				successes++
			case 0x97:
				refused[n] = true
			default:
				t.Errorf("message %d answered 0x%02x", n, code)
			}
		}
	}
	for n := range acked {
		delete(refused, n)
	}
	for _, n := range r.sentA {
		if !hasKey(r.onA, n) {
			maybe[n] = true
		}
	}
	poll.Until(t, 30*time.Second, "every acknowledged message upstream, the forward logs empty", func() bool {
		seen := map[int]bool{}
		for _, m := range c.upstream() {
			seen[m.n] = true
		}
		for n := range acked {
			if !seen[n] {
				return false
			}
		}
		for _, g := range gws {
			if g.forward.Stats()[0].Backlog != 0 {
				return false
			}
		}
		return true
	})
	allowed, fallbacks := before, uint64(0)
	for _, g := range gws {
		allowed += g.srv.Stats().Allowed
		st := g.cluster.owner.Stats()
		fallbacks += st.Fallbacks
		t.Logf("gateway %s: allowed %d, owner %+v", g.cluster.owner.ID(), g.srv.Stats().Allowed, st)
	}
	t.Logf("A answered %d (%d sent, %d unanswered at the takeover), B went on from %d: %d acknowledged in all, the gateways counted %d allowed, %d owner fallbacks",
		len(r.onA), len(r.sentA), r.inflight, r.first, successes, allowed, fallbacks)
	if successes > limit || allowed > uint64(limit) {
		t.Errorf("quota %d an hour: the device got %d PUBACKs 0x00 over both gateways, the gateways counted %d allowed", limit, successes, allowed)
	}
	got := c.upstream()
	seen := map[int]bool{}
	dups := 0
	last := map[string]int{}  // per gateway (origin): the last number
	unacked := map[int]bool{} // upstream, without a PUBACK 0x00
	each := map[string]bool{} // ORIGIN/number: what each gateway sent
	for _, m := range got {
		if seen[m.n] {
			dups++
		}
		seen[m.n] = true
		key := m.origin + "/" + strconv.Itoa(m.n)
		if each[key] {
			continue // the gateway sent it again
		}
		each[key] = true
		if !acked[m.n] && !maybe[m.n] {
			t.Errorf("upstream got %d, which the device was refused (0x97) or never sent", m.n)
		}
		if !acked[m.n] {
			unacked[m.n] = true
		}
		if m.n <= last[m.origin] {
			t.Errorf("upstream got %d from gateway %s after its %d", m.n, m.origin, last[m.origin])
		}
		last[m.origin] = max(last[m.origin], m.n)
	}
	if dups > dupBound {
		t.Errorf("upstream got %d duplicates, more than %d", dups, dupBound)
	}
	// Each admission is one append to the admitting gateway's log: a
	// publish A admitted and could not acknowledge before it closed the
	// connection (forwarded all the same), sent again to B, is admitted
	// there too, or refused as over the quota (then upstream has a
	// message the device's last answer refused: A's admission).
	if uint64(len(each)) != allowed {
		t.Errorf("upstream got %d messages of the gateways (distinct by gateway), the gateways admitted %d", len(each), allowed)
	}
	t.Logf("upstream: %d messages, %d distinct, %d duplicates, %d without a PUBACK 0x00 (admitted by A, unanswered), from %d gateways",
		len(got), len(seen), dups, len(unacked), len(last))
}

// TestForwardDeviceMovesGatewayStops: the move above with the upstream
// paused, so that A's forward log still holds every message A
// acknowledged when A is closed gracefully; the upstream resumed, B's
// messages arrive (maybe before A's: order is per gateway), and A's
// once A starts again on its data directory: none of what A
// acknowledged is lost. A message may arrive twice: each of those in
// flight at the takeover, and each A had sent upstream unacknowledged
// when it stopped.
func TestForwardDeviceMovesGatewayStops(t *testing.T) {
	const limit, total = 60, 90
	c := newMoveCluster(t, mosquittotest.Options{})
	dirA := t.TempDir()
	cfgA := c.config(dirA, "a", limit)
	a := mustStart(t, cfgA, Deps{})
	b := mustStart(t, c.config(t.TempDir(), "b", limit), Deps{})
	poll.Until(t, 20*time.Second, "both gateways connected upstream", func() bool {
		return a.forward.Stats()[0].Connected == 1 && b.forward.Stats()[0].Connected == 1
	})
	c.up.Pause()
	r := move(t, a, b, 10, total)
	held := a.forward.Stats()[0].Backlog
	closeGateway(t, a)
	admittedA := a.srv.Stats().Allowed
	if held == 0 || admittedA == 0 {
		t.Fatalf("A's forward log held %d messages at its close, A admitted %d: nothing to keep", held, admittedA)
	}
	c.up.Resume()
	poll.Until(t, 30*time.Second, "B's log emptied", func() bool { return b.forward.Stats()[0].Backlog == 0 })
	t.Logf("A closed with %d messages in its forward log; before A's restart upstream got %d", held, len(c.upstream()))
	a = mustStart(t, cfgA, Deps{})
	c.check(t, r, limit, r.inflight+int(admittedA), admittedA, a, b)
}
