package simulator

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"time"

	paho "github.com/eclipse/paho.golang/paho"
	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicegate/devicelimit"
)

// Patterns a device can publish in.
const (
	PatternSteady  = "steady"  // one message every 1/Rate
	PatternBurst   = "burst"   // Burst messages back to back every Period
	PatternPoisson = "poisson" // exponential gaps of mean 1/Rate
)

// Config describes a simulated fleet. Fill it, then call Run; zero
// fields take the defaults documented on them.
type Config struct {
	// Addr is the gateway's MQTT address, host:port. Only loopback
	// hosts (127.0.0.0/8, ::1, localhost) are allowed.
	Addr string `json:"addr"`
	// Devices is the fleet size (> 0).
	Devices int `json:"devices"`
	// IDPattern makes device i's client ID with fmt.Sprintf; default
	// "dev-%05d".
	IDPattern string `json:"id_pattern"`
	// Rate is messages per second per device for steady and poisson.
	Rate float64 `json:"rate"`
	// Pattern is steady (default), burst or poisson.
	Pattern string `json:"pattern"`
	// Burst and Period shape the burst pattern.
	Burst  int           `json:"burst,omitempty"`
	Period time.Duration `json:"period_ns,omitempty"`
	// QoS is 0 or 1 for device publishes; the subscriber uses 1.
	QoS byte `json:"qos"`
	// Protocol is 5 (default, paho.golang) or 4 (MQTT 3.1.1,
	// paho.mqtt.golang). A 3.1.1 PUBACK carries no verdict, so its
	// messages are recorded with AckNone, like QoS 0.
	Protocol int `json:"protocol"`
	// PayloadSize pads payloads to this many bytes; the header is never
	// cut.
	PayloadSize int `json:"payload_size"`
	// Topic makes a device's topic from its ID; default "devices/%s".
	// The subscriber's filter is Topic with %s replaced by "+".
	Topic string `json:"topic"`
	// Duration is how long devices publish, counted from the start of
	// the run (> 0).
	Duration time.Duration `json:"duration_ns"`
	// RampUp is connections started per second; 0 connects all at once.
	RampUp float64 `json:"ramp_up"`
	// Drain is how long to wait after publishing stops for success-acked
	// messages still in flight; default 2 s.
	Drain time.Duration `json:"drain_ns"`
	// Quota is what the gateway is expected to enforce on every device;
	// the checker judges arrivals against it.
	Quota devicelimit.Quota `json:"quota"`
	// Tolerance and Immediate are passed to the checker (CheckOptions).
	// Tolerance defaults to 50 ms; Immediate to 250 ms.
	Tolerance time.Duration `json:"tolerance_ns"`
	Immediate time.Duration `json:"immediate_ns"`
	// Seed seeds the poisson pattern; runs with the same seed publish
	// the same gaps.
	Seed uint64 `json:"seed"`
}

// withDefaults returns c with zero fields defaulted, validated.
func (c Config) withDefaults() (Config, error) {
	if c.IDPattern == "" {
		c.IDPattern = "dev-%05d"
	}
	if c.Pattern == "" {
		c.Pattern = PatternSteady
	}
	if c.Protocol == 0 {
		c.Protocol = 5
	}
	if c.Topic == "" {
		c.Topic = "devices/%s"
	}
	if c.Drain == 0 {
		c.Drain = 2 * time.Second
	}
	if c.Tolerance == 0 {
		c.Tolerance = 50 * time.Millisecond
	}
	if c.Immediate == 0 {
		c.Immediate = 250 * time.Millisecond
	}
	bad := func(field string, v any, why string) (Config, error) {
		return c, fmt.Errorf("%w: %s: %s (got %v)", ErrInvalidConfig, field, why, v)
	}
	if err := checkLoopback(c.Addr); err != nil {
		return c, err
	}
	switch {
	case c.Devices <= 0:
		return bad("devices", c.Devices, "must be > 0")
	case !strings.Contains(c.IDPattern, "%"):
		return bad("id_pattern", c.IDPattern, "must contain a verb for the device number")
	case strings.Count(c.Topic, "%s") != 1:
		return bad("topic", c.Topic, "must contain %s exactly once")
	case c.Duration <= 0:
		return bad("duration", c.Duration, "must be > 0")
	case c.QoS > 1:
		return bad("qos", c.QoS, "must be 0 or 1")
	case c.Protocol != 4 && c.Protocol != 5:
		return bad("protocol", c.Protocol, "must be 4 or 5")
	case c.RampUp < 0 || math.IsNaN(c.RampUp):
		return bad("ramp_up", c.RampUp, "must be >= 0")
	case c.Drain < 0:
		return bad("drain", c.Drain, "must be >= 0")
	case c.Quota.Limit <= 0 || c.Quota.Window <= 0:
		return bad("quota", c.Quota, "must have a limit and a window > 0")
	}
	switch c.Pattern {
	case PatternSteady, PatternPoisson:
		if !(c.Rate > 0) || math.IsInf(c.Rate, 0) {
			return bad("rate", c.Rate, "must be > 0")
		}
	case PatternBurst:
		if c.Burst <= 0 {
			return bad("burst", c.Burst, "must be > 0")
		}
		if c.Period <= 0 {
			return bad("period", c.Period, "must be > 0")
		}
	default:
		return bad("pattern", c.Pattern, "must be steady, burst or poisson")
	}
	return c, nil
}

// checkLoopback refuses any target that is not on this machine.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: addr: %v (got %q)", ErrInvalidConfig, err, addr)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%w: addr %q: only 127.0.0.0/8, ::1 or localhost", ErrNotLoopback, addr)
}

// Report is the outcome of a run. Every field has a JSON name, so the
// report can be written with encoding/json as is.
type Report struct {
	Config   Config    `json:"config"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// ConnectFailures counts devices that never connected;
	// Disconnects counts device connections that ended before the run
	// did (policy disconnect, or a fault).
	ConnectFailures int `json:"connect_failures"`
	Disconnects     int `json:"disconnects"`
	// SubscriberLost is true when the subscriber's connection ended
	// before the run did: arrivals after that were not seen, so lost
	// counts are not to be trusted.
	SubscriberLost bool `json:"subscriber_lost"`
	// BadPayloads counts arrivals on the topic filter that do not start
	// with a Header: another publisher shares the topics.
	BadPayloads int `json:"bad_payloads"`
	// Errors holds the first few distinct error messages seen.
	Errors []string `json:"errors,omitempty"`
	Result Result   `json:"result"`
	// Verdict is Decide's on Result, and not OK when SubscriberLost.
	Verdict Verdict `json:"verdict"`
}

// maxErrors bounds Report.Errors.
const maxErrors = 10

// recorder collects observations from every goroutine of a run. Safe
// for concurrent use.
type recorder struct {
	mu          sync.Mutex
	logs        map[string]*DeviceLog
	connFails   int
	disconnects int
	errs        []string
	// seen tracks, per device and seq, a success ack not yet matched by
	// an arrival (true) or an arrival not yet matched by its ack
	// (false): the ack and the arrival race.
	seen        map[seqKey]bool
	outstanding int  // success-acked messages not yet arrived
	blind       bool // some message had no ack: drain runs in full
	badPayloads int
	subLost     bool
	closing     bool // the subscriber is being closed on purpose
}

type seqKey struct {
	dev string
	seq uint64
}

func (r *recorder) log(dev string) *DeviceLog {
	l := r.logs[dev]
	if l == nil {
		l = &DeviceLog{Device: dev}
		r.logs[dev] = l
	}
	return l
}

func (r *recorder) sent(dev string, s Sent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.log(dev)
	l.Sent = append(l.Sent, s)
	k := seqKey{dev, s.Seq}
	v, ok := r.seen[k]
	switch {
	case s.Ack == AckNone:
		r.blind = true
		delete(r.seen, k)
	case ok && !v:
		delete(r.seen, k) // arrived before its ack
	case s.Ack == AckSuccess:
		r.seen[k] = true
		r.outstanding++
	}
}

func (r *recorder) arrival(dev string, a Arrival) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.log(dev)
	l.Arrivals = append(l.Arrivals, a)
	k := seqKey{dev, a.Seq}
	v, ok := r.seen[k]
	switch {
	case ok && v:
		delete(r.seen, k)
		r.outstanding--
	case !ok && !r.acked(dev, a.Seq):
		r.seen[k] = false
	}
}

func (r *recorder) fail(err error, connect bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if connect {
		r.connFails++
	} else {
		r.disconnects++
	}
	r.note(err)
}

// badPayload records an arrival that is not a simulator message.
func (r *recorder) badPayload(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.badPayloads++
	r.note(err)
}

// note keeps err's message among the first few distinct ones.
func (r *recorder) note(err error) {
	msg := err.Error()
	for _, e := range r.errs {
		if e == msg {
			return
		}
	}
	if len(r.errs) < maxErrors {
		r.errs = append(r.errs, msg)
	}
}

// acked reports whether dev's message seq has its outcome recorded;
// devices send in seq order, so that is seq < len(Sent).
func (r *recorder) acked(dev string, seq uint64) bool {
	return seq < uint64(len(r.logs[dev].Sent))
}

// drained reports whether every success-acked message has arrived and
// every message had an ack; a message without an ack may still come,
// so then only the drain period ends the wait.
func (r *recorder) drained() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.outstanding == 0 && !r.blind
}

// Run runs the fleet described by cfg against the gateway at cfg.Addr
// and checks what came through. It returns when publishing has stopped
// (after cfg.Duration, or when ctx is done) and the drain period has
// passed, with every goroutine it started stopped. An error means the
// run could not take place (bad config, subscriber failed); what went
// wrong for devices is in the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	rec := &recorder{logs: make(map[string]*DeviceLog, cfg.Devices), seen: make(map[seqKey]bool)}
	sub, err := subscribe(ctx, cfg, rec)
	if err != nil {
		return nil, err
	}
	defer sub.close()

	rep := &Report{Config: cfg, Started: time.Now()}
	runCtx, cancel := context.WithDeadline(ctx, rep.Started.Add(cfg.Duration))
	defer cancel()
	var wg sync.WaitGroup
	for i := range cfg.Devices {
		id := fmt.Sprintf(cfg.IDPattern, i)
		var delay time.Duration
		if cfg.RampUp > 0 {
			delay = time.Duration(float64(i) / cfg.RampUp * float64(time.Second))
		}
		wg.Go(func() { runDevice(runCtx, cfg, i, id, delay, rec) })
	}
	wg.Wait()

	// Drain: poll until every success-acked message has arrived or
	// the drain period ends.
	deadline := time.Now().Add(cfg.Drain)
	for !rec.drained() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	rec.mu.Lock()
	rec.closing = true
	rec.mu.Unlock()
	sub.close()
	rep.Finished = time.Now()

	rec.mu.Lock()
	rep.SubscriberLost, rep.BadPayloads = rec.subLost, rec.badPayloads
	logs := make([]DeviceLog, 0, len(rec.logs))
	for _, l := range rec.logs {
		l.Quota = cfg.Quota
		logs = append(logs, *l)
	}
	rep.ConnectFailures, rep.Disconnects, rep.Errors = rec.connFails, rec.disconnects, rec.errs
	rec.mu.Unlock()
	rep.Result = Check(logs, CheckOptions{Tolerance: cfg.Tolerance, Immediate: cfg.Immediate})
	rep.Verdict = Decide(rep.Result, 10)
	if rep.SubscriberLost {
		rep.Verdict.OK = false // the arrival log is incomplete
	}
	return rep, nil
}

// subscriber records arrivals on the fleet's topic filter.
type subscriber struct {
	c    *paho.Client
	once sync.Once
}

func (s *subscriber) close() {
	s.once.Do(func() { _ = s.c.Disconnect(&paho.Disconnect{ReasonCode: 0}) })
	<-s.c.Done()
}

func subscribe(ctx context.Context, cfg Config, rec *recorder) (*subscriber, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("subscriber: dial %s: %w", cfg.Addr, err)
	}
	id := fmt.Sprintf("simulator-sub-%08x", rand.Uint32())
	lost := func(err error) {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if rec.closing || rec.subLost {
			return
		}
		rec.subLost = true
		if len(rec.errs) < maxErrors {
			rec.errs = append(rec.errs, fmt.Sprintf("subscriber: connection lost: %v", err))
		}
	}
	c := paho.NewClient(paho.ClientConfig{
		ClientID:           id,
		Conn:               conn,
		OnClientError:      lost,
		OnServerDisconnect: func(d *paho.Disconnect) { lost(fmt.Errorf("DISCONNECT 0x%02x", d.ReasonCode)) },
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			now := time.Now()
			h, err := DecodeHeader(pr.Packet.Payload)
			if err != nil {
				rec.badPayload(fmt.Errorf("subscriber: topic %q: %w", pr.Packet.Topic, err))
				return true, nil
			}
			rec.arrival(h.Device, Arrival{Seq: h.Seq, At: now})
			return true, nil
		}},
	})
	s := &subscriber{c: c}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.Connect(cctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("subscriber: connect to %s: %w", cfg.Addr, err)
	}
	filter := strings.Replace(cfg.Topic, "%s", "+", 1)
	if _, err := c.Subscribe(cctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
		s.close()
		return nil, fmt.Errorf("subscriber: subscribe %q: %w", filter, err)
	}
	return s, nil
}

// publisher is one device's connection.
type publisher interface {
	// publish sends payload and returns what the gateway said. An error
	// means the connection is gone.
	publish(ctx context.Context, topic string, payload []byte) (Ack, byte, error)
	close()
}

// schedule returns the gap before the device's next message after n
// sent, or the whole period's worth for bursts.
type schedule struct {
	cfg Config
	rng *rand.Rand
	n   int
}

// next returns the offset from the first send of the (n+1)th message,
// given prev, the offset of the nth.
func (s *schedule) next(prev time.Duration) time.Duration {
	defer func() { s.n++ }()
	if s.n == 0 {
		return 0
	}
	switch s.cfg.Pattern {
	case PatternBurst:
		return time.Duration(s.n/s.cfg.Burst) * s.cfg.Period
	case PatternPoisson:
		return prev + time.Duration(s.rng.ExpFloat64()/s.cfg.Rate*float64(time.Second))
	default:
		return time.Duration(float64(s.n) / s.cfg.Rate * float64(time.Second))
	}
}

func runDevice(ctx context.Context, cfg Config, i int, id string, delay time.Duration, rec *recorder) {
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	var p publisher
	var err error
	if cfg.Protocol == 4 {
		p, err = dial4(ctx, cfg.Addr, id, cfg.QoS)
	} else {
		p, err = dial5(ctx, cfg.Addr, id, cfg.QoS)
	}
	if err != nil {
		if ctx.Err() == nil {
			rec.fail(fmt.Errorf("device %s: %w", id, err), true)
		}
		return
	}
	defer p.close()
	topic := fmt.Sprintf(cfg.Topic, id)
	sch := &schedule{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, uint64(i)))}
	start := time.Now()
	var off time.Duration
	buf := make([]byte, 0, max(cfg.PayloadSize, headerFixed+len(id)))
	for seq := uint64(0); ; seq++ {
		off = sch.next(off)
		if wait := time.Until(start.Add(off)); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		} else if ctx.Err() != nil {
			return
		}
		at := time.Now()
		payload := AppendHeader(buf[:0], Header{Device: id, Seq: seq, Sent: at}, cfg.PayloadSize)
		ack, code, err := p.publish(ctx, topic, payload)
		rec.sent(id, Sent{Seq: seq, At: at, Ack: ack, Code: code})
		if err != nil {
			if ctx.Err() == nil {
				rec.fail(fmt.Errorf("device %s: %w", id, err), false)
			}
			return
		}
	}
}

// client5 is an MQTT 5 device (paho.golang).
type client5 struct {
	c   *paho.Client
	qos byte
}

func dial5(ctx context.Context, addr, id string, qos byte) (*client5, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	c := paho.NewClient(paho.ClientConfig{ClientID: id, Conn: conn})
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.Connect(cctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	return &client5{c: c, qos: qos}, nil
}

func (c *client5) publish(ctx context.Context, topic string, payload []byte) (Ack, byte, error) {
	// A PUBACK must come within 5 s even as the run ends, so that the
	// outcome of the last message is known.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	resp, err := c.c.Publish(pctx, &paho.Publish{Topic: topic, QoS: c.qos, Payload: payload})
	if c.qos == 0 {
		return AckNone, 0, err
	}
	if resp == nil {
		if err == nil {
			err = errors.New("publish: no response")
		}
		return AckNone, 0, err
	}
	if resp.ReasonCode >= 0x80 {
		return AckRefused, resp.ReasonCode, nil // paho reports it as an error too
	}
	return AckSuccess, resp.ReasonCode, nil
}

func (c *client5) close() {
	_ = c.c.Disconnect(&paho.Disconnect{ReasonCode: 0})
	<-c.c.Done()
}

// client4 is an MQTT 3.1.1 device (paho.mqtt.golang).
type client4 struct {
	c   mqtt.Client
	qos byte
}

func dial4(ctx context.Context, addr, id string, qos byte) (*client4, error) {
	opts := mqtt.NewClientOptions().
		AddBroker("tcp://" + addr).
		SetClientID(id).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetConnectTimeout(10 * time.Second)
	c := mqtt.NewClient(opts)
	tok := c.Connect()
	select {
	case <-tok.Done():
	case <-ctx.Done():
		c.Disconnect(0)
		return nil, ctx.Err()
	}
	if err := tok.Error(); err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return &client4{c: c, qos: qos}, nil
}

func (c *client4) publish(ctx context.Context, topic string, payload []byte) (Ack, byte, error) {
	tok := c.c.Publish(topic, c.qos, false, payload)
	if !tok.WaitTimeout(5 * time.Second) {
		return AckNone, 0, errors.New("publish: no PUBACK within 5s")
	}
	// A 3.1.1 PUBACK has no reason code: the client learns nothing
	// about the gateway's verdict.
	return AckNone, 0, tok.Error()
}

func (c *client4) close() { c.c.Disconnect(100) }
