package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/topk"
)

// waitTimeout bounds every wait for the network; nothing in these tests
// waits for time to pass (the clock is manual). It only catches a broker
// that never answers, so it is generous: on a loaded 2-core machine under
// the race detector, twelve wrong argon2id passwords queued for two
// processors (TestWrongPasswordFloodMemoryBounded) and 5,000 publishes
// behind a consumer's writer (TestConsumerQueueAccounting) took over
// 10 s at load 30.
const waitTimeout = time.Minute

const testBuckets = 10

// t0 is the manual clock's start.
var t0 = devicelimit.TickOf(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))

// generous is the default quota: subscribers and unthrottled publishers
// never come near it.
var generous = devicelimit.Quota{Limit: 100000, Window: time.Second}

type fixture struct {
	srv      *Server
	clock    *devicelimit.ManualClock
	table    *devicelimit.Table
	resolver *devicelimit.Resolver
	addr     string
}

type fixtureOpts struct {
	identity devicelimit.Identity
	rules    []devicelimit.Rule
	def      devicelimit.Quota // generous when zero
	logger   *slog.Logger

	store  DeferStore // enables policy defer
	limits DeferLimits
	// releaseLoop runs the production release loop; without it release
	// rounds happen only when the test calls releaseTick.
	releaseLoop bool
	clock       *devicelimit.ManualClock // a fresh one at t0 when nil
	table       *devicelimit.Table       // a fresh one when nil
	throttled   *topk.Tracker            // Options.Throttled
	// options, when set, changes the Options before New (auth, TLS,
	// limits).
	options func(*Options)
}

// start runs a real broker on 127.0.0.1:0 with a manual clock.
func start(t *testing.T, fo fixtureOpts) *fixture {
	t.Helper()
	if fo.def == (devicelimit.Quota{}) {
		fo.def = generous
	}
	table := fo.table
	if table == nil {
		var err error
		if table, err = devicelimit.NewTable(testBuckets); err != nil {
			t.Fatal(err)
		}
	}
	resolver, err := devicelimit.NewResolver(fo.def, fo.rules, testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	clock := fo.clock
	if clock == nil {
		clock = devicelimit.NewManualClock(t0)
	}
	o := Options{
		TCPAddr:     "127.0.0.1:0",
		Table:       table,
		Resolver:    resolver,
		Clock:       clock,
		Identity:    fo.identity,
		Logger:      fo.logger,
		Defer:       fo.store,
		DeferLimits: fo.limits,
		Throttled:   fo.throttled,
	}
	if fo.options != nil {
		fo.options(&o)
	}
	srv, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	srv.noReleaseLoop = !fo.releaseLoop
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			var b strings.Builder
			_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Errorf("close: %v\n%s", err, b.String())
		}
	})
	f := &fixture{srv: srv, clock: clock, table: table, resolver: resolver}
	if a := srv.Addr(); a != nil {
		f.addr = a.String()
	}
	return f
}

// rule returns a rule giving client IDs matching pattern limit messages
// per second under policy.
func rule(pattern string, limit int, policy devicelimit.Policy) devicelimit.Rule {
	return devicelimit.Rule{Name: pattern, ClientID: pattern,
		Quota: devicelimit.Quota{Limit: limit, Window: time.Second, Policy: policy}}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond) // polling the network, not letting time pass
	}
}

// receive waits for a value on ch.
func receive[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitTimeout):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// sink records the payloads a subscriber receives, in order.
type sink struct {
	mu  sync.Mutex
	got []string
}

func (s *sink) add(p string) {
	s.mu.Lock()
	s.got = append(s.got, p)
	s.mu.Unlock()
}

func (s *sink) payloads() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

func (s *sink) has(p string) bool {
	for _, g := range s.payloads() {
		if g == p {
			return true
		}
	}
	return false
}

// waitMarker waits for marker and returns what arrived before it.
func (s *sink) waitMarker(t *testing.T, marker string) []string {
	t.Helper()
	eventually(t, "marker "+marker, func() bool { return s.has(marker) })
	var before []string
	for _, p := range s.payloads() {
		if p == marker {
			return before
		}
		before = append(before, p)
	}
	return before
}

// waitDecided waits until the throttle has decided n device publishes.
func (f *fixture) waitDecided(t *testing.T, n uint64) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d decisions", n), func() bool {
		st := f.srv.Stats()
		return st.Allowed+st.Dropped+st.Disconnected >= n
	})
}

// subscribe connects an MQTT 5 subscriber to filter (QoS 1).
func (f *fixture) subscribe(t *testing.T, id, username, filter string) *sink {
	t.Helper()
	s := new(sink)
	c := f.dial5(t, id, username, func(p *paho.Publish) { s.add(string(p.Payload)) })
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
		t.Fatalf("subscribe %s: %v", filter, err)
	}
	return s
}

// ack is what a publisher learned from the server about one publish.
type ack struct {
	code   byte   // reason code of PUBACK/PUBREC; 0 for QoS 0 and 3.1.1
	reason string // reason string (MQTT 5)
}

// publisher is a connected MQTT 3.1.1 or 5 client.
type publisher interface {
	publish(t *testing.T, topic, payload string, qos byte) (ack, error)
	// send publishes without waiting for an ack (for publishes that get
	// none: the connection is closed instead).
	send(topic, payload string, qos byte)
	// lost is closed when the server ends the connection; for MQTT 5
	// disconnect holds the server's DISCONNECT, if it sent one.
	lost() <-chan struct{}
	disconnect() *paho.Disconnect
	close()
}

// connect connects a publisher of the protocol version (3 = 3.1.1, 5).
func (f *fixture) connect(t *testing.T, version int, id, username string) publisher {
	t.Helper()
	p, err := f.tryConnect(t, version, id, username)
	if err != nil {
		t.Fatalf("connect %s (MQTT %d): %v", id, version, err)
	}
	return p
}

// connectWithWill connects a publisher that leaves a will (QoS 1) on
// topic.
func (f *fixture) connectWithWill(t *testing.T, version int, id, topic, payload string) publisher {
	t.Helper()
	p, err := f.dial(t, version, id, "", &will{topic, payload})
	if err != nil {
		t.Fatalf("connect %s (MQTT %d): %v", id, version, err)
	}
	return p
}

type will struct{ topic, payload string }

func (f *fixture) tryConnect(t *testing.T, version int, id, username string) (publisher, error) {
	t.Helper()
	return f.dial(t, version, id, username, nil)
}

func (f *fixture) dial(t *testing.T, version int, id, username string, w *will) (publisher, error) {
	t.Helper()
	if version == 5 {
		p := &pub5{lostCh: make(chan struct{})}
		c, connack, err := f.tryDial5(t, id, username, w, nil, p.onDisconnect, p.onError)
		if err != nil {
			if connack != nil {
				return nil, fmt.Errorf("%w: connack 0x%02x %q", err, connack.ReasonCode, connackReason(connack))
			}
			return nil, err
		}
		p.c = c
		return p, nil
	}
	p := &pub3{lostCh: make(chan struct{})}
	opts := mqtt3.NewClientOptions().
		AddBroker("tcp://" + f.addr).
		SetClientID(id).
		SetUsername(username).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetOrderMatters(true).
		SetConnectTimeout(waitTimeout).
		SetConnectionLostHandler(func(mqtt3.Client, error) { p.once.Do(func() { close(p.lostCh) }) })
	if w != nil {
		opts.SetWill(w.topic, w.payload, 1, false)
	}
	p.c = mqtt3.NewClient(opts)
	tok := p.c.Connect()
	if !tok.WaitTimeout(waitTimeout) {
		return nil, errors.New("connect timed out")
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	t.Cleanup(p.close)
	return p, nil
}

func connackReason(c *paho.Connack) string {
	if c.Properties == nil {
		return ""
	}
	return c.Properties.ReasonString
}

type pub3 struct {
	c      mqtt3.Client
	once   sync.Once
	lostCh chan struct{}
}

func (p *pub3) publish(t *testing.T, topic, payload string, qos byte) (ack, error) {
	t.Helper()
	tok := p.c.Publish(topic, qos, false, payload)
	if !tok.WaitTimeout(waitTimeout) {
		t.Fatalf("publish %q QoS %d: no ack within %s", payload, qos, waitTimeout)
	}
	return ack{}, tok.Error()
}

func (p *pub3) send(topic, payload string, qos byte) {
	// paho.mqtt.golang's Publish blocks up to 30s once the connection is
	// gone (it waits for the dead writer); nothing waits for this one.
	go p.c.Publish(topic, qos, false, payload)
}

func (p *pub3) lost() <-chan struct{}        { return p.lostCh }
func (p *pub3) disconnect() *paho.Disconnect { return nil }
func (p *pub3) close()                       { p.c.Disconnect(0) }

type pub5 struct {
	c      *paho.Client
	mu     sync.Mutex
	disc   *paho.Disconnect
	once   sync.Once
	lostCh chan struct{}
}

func (p *pub5) onDisconnect(d *paho.Disconnect) {
	p.mu.Lock()
	p.disc = d
	p.mu.Unlock()
	p.once.Do(func() { close(p.lostCh) })
}

func (p *pub5) onError(error) { p.once.Do(func() { close(p.lostCh) }) }

func (p *pub5) publish(t *testing.T, topic, payload string, qos byte) (ack, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	resp, err := p.c.Publish(ctx, &paho.Publish{Topic: topic, QoS: qos, Payload: []byte(payload)})
	if resp == nil {
		return ack{}, err
	}
	a := ack{code: resp.ReasonCode}
	if resp.Properties != nil {
		a.reason = resp.Properties.ReasonString
	}
	if a.code >= 0x80 {
		err = nil // paho reports a PUBACK >= 0x80 as an error too; the code says it
	}
	return a, err
}

func (p *pub5) send(topic, payload string, qos byte) {
	_, _ = p.c.PublishWithOptions(context.Background(), &paho.Publish{Topic: topic, QoS: qos, Payload: []byte(payload)},
		paho.PublishOptions{Method: paho.PublishMethod_AsyncSend})
}

func (p *pub5) lost() <-chan struct{} { return p.lostCh }

func (p *pub5) disconnect() *paho.Disconnect {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.disc
}

func (p *pub5) close() { _ = p.c.Disconnect(&paho.Disconnect{ReasonCode: 0}) }

// dial5 connects an MQTT 5 client that hands received messages to onMsg.
func (f *fixture) dial5(t *testing.T, id, username string, onMsg func(*paho.Publish)) *paho.Client {
	t.Helper()
	c, connack, err := f.tryDial5(t, id, username, nil, onMsg, nil, nil)
	if err != nil {
		t.Fatalf("connect %s (MQTT 5): %v (connack %+v)", id, err, connack)
	}
	return c
}

func (f *fixture) tryDial5(t *testing.T, id, username string, w *will, onMsg func(*paho.Publish),
	onDisconnect func(*paho.Disconnect), onError func(error)) (*paho.Client, *paho.Connack, error) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", f.addr, waitTimeout)
	if err != nil {
		return nil, nil, err
	}
	cfg := paho.ClientConfig{
		ClientID:           id,
		Conn:               conn,
		OnServerDisconnect: onDisconnect,
		OnClientError:      onError,
		// paho's own bound on an acknowledgement (10 s by default) is
		// ours: TestConsumerQueueAccounting's QoS 1 publish after 5,000
		// waited longer at load 40.
		PacketTimeout: waitTimeout,
	}
	if onMsg != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){
			func(r paho.PublishReceived) (bool, error) { onMsg(r.Packet); return true, nil },
		}
	}
	c := paho.NewClient(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	cp := &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}
	if username != "" {
		cp.Username, cp.UsernameFlag = username, true
	}
	if w != nil {
		cp.WillMessage = &paho.WillMessage{Topic: w.topic, Payload: []byte(w.payload), QoS: 1}
	}
	connack, err := c.Connect(ctx, cp)
	if err != nil {
		_ = conn.Close()
		return nil, connack, err
	}
	t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{ReasonCode: 0}) })
	return c, connack, nil
}

// payloads returns "prefix-0" .. "prefix-(n-1)".
func payloads(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

func equal(a, b []string) bool { return strings.Join(a, "\x00") == strings.Join(b, "\x00") }
