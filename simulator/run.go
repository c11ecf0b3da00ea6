package simulator

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/devicegate/devicegate/devicelimit"

	paho "github.com/eclipse/paho.golang/paho"
)

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
	rec := newRecorder(cfg)
	subs, err := subscribeAll(ctx, cfg, rec)
	if err != nil {
		return nil, err
	}
	f := &fleet{cfg: cfg, rec: rec, sub: subs[0], more: subs[1:], gate: &gate{}, clients: make(map[string]*clientCount),
		hops: make([]uint32, cfg.Devices)}
	defer func() {
		for _, s := range f.more {
			s.close()
		}
	}()
	for _, c := range cfg.clients {
		f.clients[c.Client] = new(clientCount)
	}
	defer func() { f.sub.close() }()

	rep := &Report{Config: cfg, Started: time.Now()}
	cpu0 := selfUsage().CPU
	f.started = rep.Started
	runCtx, cancel := context.WithDeadline(ctx, rep.Started.Add(cfg.Duration))
	defer cancel()
	var wg, bg sync.WaitGroup
	if cfg.RestartAt > 0 {
		bg.Go(func() {
			if sleepUntil(runCtx, rep.Started.Add(cfg.RestartAt)) {
				rep.Restarts = append(rep.Restarts, f.restart(runCtx))
			}
		})
	}
	if cfg.UpstreamOutageAt > 0 {
		bg.Go(func() { f.runOutage(ctx, rep) })
	}
	progressDone := make(chan struct{})
	if cfg.Progress != nil {
		bg.Go(func() { f.report(progressDone) })
	}
	for i := range cfg.Devices {
		var delay time.Duration
		if cfg.RampUp > 0 {
			delay = time.Duration(float64(i) / cfg.RampUp * float64(time.Second))
		}
		wg.Go(func() { f.device(runCtx, i, cfg.DeviceID(i), delay) })
	}
	wg.Wait()
	cancel() // a restart not reached yet is not started
	close(progressDone)
	bg.Wait() // an outage still on ends: the backlog drains below

	// Drain: poll until every success-acked message has arrived or
	// the drain period ends.
	deadline := time.Now().Add(cfg.Drain)
	for !rec.drained() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	rec.mu.Lock()
	rec.closing = true
	rec.mu.Unlock()
	f.sub.close()
	for _, s := range f.more {
		s.close()
	}
	rep.Finished = time.Now()

	rec.mu.Lock()
	rep.SubscriberLost, rep.BadPayloads, rep.Reconnects = rec.subLost, rec.badPayloads, rec.reconnects
	logs := make([]DeviceLog, 0, len(rec.logs))
	for _, l := range rec.logs {
		l.Quota = rec.quotas[l.Device]
		l.Classes = classQuotas(cfg.TopicClasses)
		if cfg.Group != nil {
			l.Group = cfg.Group.Name
		}
		logs = append(logs, *l)
	}
	rep.ConnectFailures, rep.Disconnects, rep.Errors = rec.connFails, rec.disconnects, rec.errs
	rep.Failovers, rep.Readmitted = rec.sortedFailovers()
	if !rec.allConnected.IsZero() {
		rep.AllConnected = rec.allConnected.Sub(rep.Started)
	}
	rep.RefusedAtConnect = rec.connRefused
	rep.Connect = latencyOf(rec.connects)
	for d := range rec.blocked {
		rep.Blocked = append(rep.Blocked, d)
	}
	slices.Sort(rep.Blocked)
	rec.mu.Unlock()
	allowances(logs, rep.Restarts, cfg.CrashLoss+cfg.Tolerance)
	opts := CheckOptions{Tolerance: cfg.Tolerance, Immediate: cfg.Immediate}
	if cfg.Group != nil {
		opts.Groups = map[string]devicelimit.Quota{cfg.Group.Name: cfg.Group.Quota}
	}
	rep.Result = Check(logs, opts)
	rep.Puback = pubackLatency(logs, time.Time{})
	if rep.AllConnected > 0 {
		rep.PubackConnected = pubackLatency(logs, rep.Started.Add(rep.AllConnected))
	}
	rep.Clients = clientResults(cfg, logs, rep.Result, f.clients, rep.Started.Add(cfg.Duration))
	rep.Availability = availability(logs, rep.Restarts)
	rep.Simulator = selfUsage()
	rep.Simulator.CPU -= cpu0
	rep.Verdict = Decide(rep.Result, 10)
	if rep.SubscriberLost {
		rep.Verdict.OK = false // the arrival log is incomplete
	}
	if rep.RefusedAtConnect > 0 {
		rep.Verdict.OK = false // the fleet is not what was asked for
	}
	return rep, nil
}

// topicsOf returns the classes' topic templates.
func topicsOf(cs []TopicClass) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.Topic
	}
	return out
}

// classQuotas returns the classes' quotas by name; nil for none.
func classQuotas(cs []TopicClass) map[string]devicelimit.Quota {
	if len(cs) == 0 {
		return nil
	}
	out := make(map[string]devicelimit.Quota, len(cs))
	for _, c := range cs {
		out[c.Name] = c.Quota
	}
	return out
}

// fleet is the state a run's goroutines share.
type fleet struct {
	cfg  Config
	rec  *recorder
	sub  *subscriber   // replaced by a restart
	more []*subscriber // the other subscribers of Config.SubAddrs
	// hops counts, per device, the moves to the next of Config.Addrs;
	// hops[i] belongs to device i's goroutine.
	hops    []uint32
	gate    *gate
	started time.Time
	// clients counts, per client of Config.Client, what is not in the
	// devices' logs; the map is read-only during the run.
	clients map[string]*clientCount
}

// report calls cfg.Progress every ProgressEvery until done is closed.
func (f *fleet) report(done <-chan struct{}) {
	t := time.NewTicker(f.cfg.ProgressEvery)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			p := f.rec.progress()
			p.Elapsed = time.Since(f.started)
			f.cfg.Progress(p)
		}
	}
}

// sleepUntil waits until t; false when ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	wait := time.Until(t)
	if wait <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(wait)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
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

// subscribe connects the subscriber at Config.SubAddr, or Addr.
func subscribe(ctx context.Context, cfg Config, rec *recorder) (*subscriber, error) {
	if cfg.SubAddr != "" {
		return subscribeAt(ctx, cfg, rec, cfg.SubAddr, true, false)
	}
	return subscribeAt(ctx, cfg, rec, cfg.Addr, false, false)
}

// subscribeAt connects a subscriber at addr: an upstream broker (plain
// TCP, no login), or a gateway. A tolerant subscriber's loss is noted,
// not a lost subscriber of the run (Config.SubAddrs).
// releasedAt returns the release instant a released deferred message
// carries (devicelimit.ReleasedProperty), or the zero time.
func releasedAt(p *paho.PublishProperties) time.Time {
	if p == nil {
		return time.Time{}
	}
	v := p.User.Get(devicelimit.ReleasedProperty)
	if v == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}
	}
	return t
}

func subscribeAt(ctx context.Context, cfg Config, rec *recorder, addr string, upstream, tolerant bool) (*subscriber, error) {
	dial := func(ctx context.Context, addr string) (net.Conn, error) { return cfg.Auth.dialConn(ctx, addr, nil) }
	user, password := cfg.Auth.subCredentials()
	if upstream {
		user, password = "", ""
		dial = func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, "tcp", addr)
		}
	}
	conn, err := dial(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("subscriber: dial %s: %w", addr, err)
	}
	id := cfg.Auth.SubClientID
	if id == "" && user != "" {
		id = user
	}
	if id == "" {
		id = fmt.Sprintf("simulator-sub-%08x", rand.Uint32())
	}
	lost := func(err error) {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if rec.closing || rec.restarting || rec.subLost {
			return
		}
		if tolerant {
			rec.note(fmt.Errorf("subscriber at %s: connection lost: %w", addr, err))
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
			rec.arrival(h.Device, Arrival{Seq: h.Seq, At: now, Released: releasedAt(pr.Packet.Properties)})
			return true, nil
		}},
	})
	s := &subscriber{c: c}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if ca, err := c.Connect(cctx, connect5(id, user, password, 0)); err != nil {
		conn.Close()
		return nil, fmt.Errorf("subscriber %s (user %q): connect to %s: %w", id, user, addr, refused5(ca, err))
	}
	for _, topic := range append([]string{cfg.Topic}, topicsOf(cfg.TopicClasses)...) {
		filter := strings.Replace(topic, "%s", "+", 1)
		if sa, err := c.Subscribe(cctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: max(1, cfg.QoS)}}}); err != nil {
			s.close()
			if sa != nil && len(sa.Reasons) == 1 && sa.Reasons[0] == 0x87 {
				return nil, fmt.Errorf("subscriber (user %q): subscribe %q: SUBACK 0x87 not authorized: the topic ACL refuses it; with authentication on the subscriber needs a consumer account (gateway passwd --role consumer)", user, filter)
			}
			return nil, fmt.Errorf("subscriber: subscribe %q: %w", filter, err)
		}
	}
	return s, nil
}

// schedule returns the gap before the device's next message after n
// sent, or the whole period's worth for bursts.
type schedule struct {
	cfg   *Config
	rng   *rand.Rand
	n     int
	flood bool // a flood device: steady at cfg.FloodRate
}

// next returns the offset from the first send of the (n+1)th message,
// given prev, the offset of the nth.
func (s *schedule) next(prev time.Duration) time.Duration {
	defer func() { s.n++ }()
	if s.n == 0 {
		return 0
	}
	if s.flood {
		return time.Duration(float64(s.n) / s.cfg.FloodRate * float64(time.Second))
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

// device runs device i until ctx ends: connect after delay, publish on
// schedule, reconnect after a storm or a restart.
func (f *fleet) device(ctx context.Context, i int, id string, delay time.Duration) {
	// The Config by pointer: a copy would sit on every device's stack
	// (and in its schedule) all run long.
	cfg, rec := &f.cfg, f.rec
	if !sleepUntil(ctx, time.Now().Add(delay)) {
		return
	}
	gen := f.gate.generation()
	p := f.firstConnect(ctx, i, id)
	if p == nil {
		return
	}
	rec.connection(1, false)
	defer func() {
		if p != nil {
			p.close()
			rec.connection(-1, false)
		}
	}()
	if lc, ok := p.(*clientLean); ok && lc.feedback != nil {
		f.adaptive(ctx, i, id, lc)
		return
	}
	var err error
	topics := map[string]string{cfg.Topic: fmt.Sprintf(cfg.Topic, id)}
	for _, tc := range cfg.TopicClasses {
		topics[tc.Topic] = fmt.Sprintf(tc.Topic, id)
	}
	sch := &schedule{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, uint64(i))), flood: i < cfg.Flood}
	start := time.Now()
	storm := cfg.StormAt > 0
	off := sch.next(0) // offset of the next message due
	buf := make([]byte, 0, max(cfg.PayloadSize, headerFixed+len(id)))
	var lostAt time.Time // when a connection was lost under Failover
	// resend: the message whose connection broke under Failover goes
	// again at once after the reconnect, as an SDK re-sends an
	// unacknowledged QoS 1 message, not at the next slot.
	resend := false
	// reconnect closes p and connects again, once the gateway is back
	// from a restart; false when the device is done.
	reconnect := func() bool {
		if p != nil {
			p.close()
			rec.connection(-1, false)
			p = nil
		}
		for attempt := 0; ; attempt++ {
			if !f.gate.wait(ctx) {
				return false
			}
			gen = f.gate.generation()
			if p, err = f.dial(ctx, i, id); err != nil {
				f.hop(i)
			} else {
				rec.connection(1, true)
				// Slots missed while away are skipped, not sent in a burst.
				for start.Add(off).Before(time.Now()) {
					off = sch.next(off)
				}
				return true
			}
			if ctx.Err() != nil {
				return false
			}
			// A storm of thousands of connects can meet refusals: back off.
			if !sleepUntil(ctx, time.Now().Add(backoff(attempt))) {
				return false
			}
		}
	}
	for seq := uint64(0); ; seq++ {
		if stormAt := f.started.Add(cfg.StormAt); storm && !start.Add(off).Before(stormAt) {
			storm = false
			if !sleepUntil(ctx, stormAt) || !reconnect() {
				return
			}
		}
		due := start.Add(off)
		if resend {
			due = time.Now()
		}
		ok, err := waitToSend(ctx, p, due)
		if !ok {
			return
		}
		if err == nil {
			at := time.Now()
			payload := AppendHeader(buf[:0], Header{Device: id, Seq: seq, Sent: at}, cfg.PayloadSize)
			tmpl, class := cfg.ClassTopic(seq)
			var ack Ack
			var code byte
			ack, code, err = p.publish(ctx, topics[tmpl], payload)
			var ackAt time.Time
			if ack != AckNone {
				ackAt = time.Now()
			}
			rec.sent(id, Sent{Seq: seq, At: at, Ack: ack, Code: code, AckAt: ackAt, Size: len(payload), Class: class})
			if ack == AckSuccess && !lostAt.IsZero() {
				rec.failedOver(lostAt, ackAt)
				lostAt = time.Time{}
			}
			if !resend {
				off = sch.next(off)
			}
			resend = false
			if err == nil {
				continue
			}
		} else {
			seq-- // nothing was sent: the next message keeps this number
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrBlocked) {
			rec.blockedDevice(id) // the gateway's automatic blocking: not a fault
			return
		}
		if f.gate.generation() == gen {
			// Not a restart: the gateway closed the connection (policy
			// disconnect) or failed.
			if !cfg.Failover {
				rec.fail(fmt.Errorf("device %s: %w", id, err), false)
				return
			}
			rec.lostConnection(fmt.Errorf("device %s: %w", id, err))
			if lostAt.IsZero() {
				lostAt = time.Now()
			}
			f.hop(i)
			resend = true
		}
		if !reconnect() {
			return
		}
	}
}

// firstConnect connects device i; nil when it could not, recorded.
func (f *fleet) firstConnect(ctx context.Context, i int, id string) publisher {
	rec := f.rec
	for attempt := 0; ; attempt++ {
		began := time.Now()
		p, err := f.dial(ctx, i, id)
		if err == nil {
			rec.connectTook(time.Since(began))
			return p
		}
		f.hop(i)
		// Thousands of connects at once can meet refusals and
		// timeouts on a busy machine: try again a few times; but a
		// gateway that refuses the device's credentials or client ID
		// will refuse it again.
		if errors.Is(err, ErrBlocked) {
			rec.blockedDevice(id)
			return nil
		}
		refused := errors.Is(err, ErrConnectRefused)
		if refused || ctx.Err() != nil || attempt == connectAttempts-1 || !sleepUntil(ctx, time.Now().Add(backoff(attempt))) {
			if ctx.Err() == nil {
				rec.fail(fmt.Errorf("device %s: %w", id, err), true)
			}
			if refused {
				rec.refusedAtConnect()
			}
			return nil
		}
	}
}

// pinger is a publisher that must show the broker it is alive between
// messages: the lean client under a broker's keepalive (paho clients
// ping on their own).
type pinger interface {
	pingDue() (time.Time, bool)
	ping() error
}

// waitToSend waits until due, pinging the broker in between when p
// must. It returns false when ctx ended first, and a ping's error (the
// connection is gone) with true.
func waitToSend(ctx context.Context, p publisher, due time.Time) (bool, error) {
	if pg, ok := p.(pinger); ok {
		for {
			at, need := pg.pingDue()
			if !need || !at.Before(due) {
				break
			}
			if !sleepUntil(ctx, at) {
				return false, nil
			}
			if err := pg.ping(); err != nil {
				return true, err
			}
		}
	}
	return sleepUntil(ctx, due), nil
}

// connectAttempts is how often a device tries its first connection.
const connectAttempts = 5

// backoff is the pause after the attempt'th failed connect: 50 ms,
// doubling, at most 2 s.
func backoff(attempt int) time.Duration {
	return min(50*time.Millisecond<<min(attempt, 8), 2*time.Second)
}

// dial connects device id with the configured protocol and its client,
// counting the bytes on its connection into its client's wire count.
func (f *fleet) dial(ctx context.Context, i int, id string) (publisher, error) {
	client := f.cfg.ClientOf(i)
	var w *wireCount
	if cc := f.clients[client]; cc != nil {
		w = &cc.wire
	}
	// A failed dial returns a nil interface, not a nil *client.
	if f.cfg.Protocol == 4 {
		c, err := dial4(ctx, f.addr(i), id, f.cfg.QoS, f.auth(i), w)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
	if client == ClientLean || client == ClientAdaptive {
		c, err := dialLean(ctx, f.addr(i), id, f.cfg.QoS, f.auth(i), w, client == ClientAdaptive)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
	c, err := dial5(ctx, f.addr(i), id, f.cfg.QoS, f.auth(i), w)
	if err != nil {
		return nil, err
	}
	return c, nil
}
