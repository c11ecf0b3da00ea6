// Package forward hands admitted device messages on to an upstream MQTT
// broker, through a durable forward log: a message is appended (and
// fsynced, in the store's group commit) before the device is
// acknowledged, and leaves the log only once the upstream acknowledged
// it. A connection lost, a broker that stops answering or a gateway
// killed costs nothing acknowledged: the log is sent again from its
// start, in order (at least once; duplicates only from what was in
// flight).
//
// One Forwarder serves one upstream connection and its own log; a
// device always goes through the same one, so its messages reach the
// upstream in the order the gateway accepted them.
package forward

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"devicegate/internal/mqtt3"
	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Log is the durable forward log (persist.Store).
type Log interface {
	AppendForward(log string, seq uint64, rec []byte) error
	ReadForward(log string, from uint64, fn func(seq uint64, rec []byte) bool) error
	DeleteForward(log string, seqs []uint64) error
	ForwardStats(log string) (messages int, bytes int64, first, last uint64, err error)
}

// Overflow says what happens when a forward log is full.
type Overflow uint8

// The overflow policies.
const (
	DropOldest Overflow = iota // the oldest messages waiting make room
	RefuseNew                  // new messages are refused (ErrFull)
)

// ErrFull is Append's error when the log is full under RefuseNew.
var ErrFull = errors.New("forward log full")

// Config is one upstream connection.
type Config struct {
	// Name names the connection in logs and its forward log.
	Name string
	// Upstream names the upstream the connection belongs to, for
	// metrics; Name when empty.
	Upstream string
	// Addr is the upstream broker's host:port (MQTT 3.1.1 over TCP).
	Addr string
	// ClientID is the connection's client ID, unique upstream.
	ClientID string
	// Username and Password log in upstream, when Username is set.
	Username, Password string
	// LocalPrefix, when a topic starts with it, is replaced by
	// RemotePrefix upstream ("devices/" -> "site-7/devices/").
	LocalPrefix, RemotePrefix string
	// MaxQoS bounds the upstream QoS: 0 or 1 (a message goes at the
	// lower of its own QoS and this).
	MaxQoS byte
	// Window is the most messages in flight upstream (default 100).
	Window int
	// AckTimeout is how long the oldest message in flight may wait for
	// its acknowledgement before the connection is taken for dead
	// (default 5 s).
	AckTimeout time.Duration
	// MaxBytes bounds the log's record bytes (0: no bound). Beyond it,
	// Overflow decides: drop the oldest messages waiting (DropOldest,
	// the default) or refuse new ones (RefuseNew: Append fails with
	// ErrFull).
	MaxBytes int64
	Overflow Overflow
	// Subscribe lists upstream topic filters whose messages Deliver
	// publishes locally, under the reverse prefix mapping (commands to
	// devices).
	Subscribe []string
	Deliver   func(topic string, payload []byte, retain bool, qos byte) error
	// MinBackoff and MaxBackoff bound the wait between connection
	// attempts, doubled after each failure, with jitter (defaults 100 ms
	// and 30 s).
	MinBackoff, MaxBackoff time.Duration
}

func (c *Config) defaults() error {
	switch {
	case c.Name == "":
		return errors.New("forward: a connection needs a name")
	case c.Addr == "":
		return fmt.Errorf("forward %s: no upstream address", c.Name)
	case c.ClientID == "":
		return fmt.Errorf("forward %s: no client ID", c.Name)
	case c.MaxQoS > 1:
		return fmt.Errorf("forward %s: max QoS must be 0 or 1 (got %d)", c.Name, c.MaxQoS)
	}
	if c.Upstream == "" {
		c.Upstream = c.Name
	}
	if c.Window <= 0 {
		c.Window = 100
	}
	if c.AckTimeout <= 0 {
		c.AckTimeout = 5 * time.Second
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = max(30*time.Second, c.MinBackoff)
	}
	return nil
}

// Forwarder forwards one upstream connection's log. Build it with New,
// feed it with Append, run it with Run.
type Forwarder struct {
	cfg  Config
	log  Log
	slog *slog.Logger

	mu   sync.Mutex
	next uint64 // the next message's sequence number
	wake chan struct{}

	connected atomic.Bool
	forwarded atomic.Uint64 // messages the upstream acknowledged
	// backlog and backlogBytes count what the log holds: what it held
	// at New, plus appends, less what left it. Only Run's goroutine
	// deletes, so the counts stay exact.
	backlog, backlogBytes atomic.Int64
	// droppedOldest and refused count what overflow cost.
	droppedOldest, refused atomic.Uint64
	fullLogged             time.Time // Run's goroutine: the last "log full" line
}

// Stats is a forwarder's state for metrics and the admin API.
type Stats struct {
	Name         string // the upstream's
	Connected    bool
	Forwarded    uint64 // acknowledged by the upstream since start
	Backlog      int64  // messages in the forward log
	BacklogBytes int64  // their record bytes
	// DroppedOldest and Refused count the messages overflow cost: the
	// oldest dropped for room, the new refused.
	DroppedOldest, Refused uint64
}

// Stats returns the forwarder's state.
func (f *Forwarder) Stats() Stats {
	return Stats{Name: f.cfg.Upstream, Connected: f.connected.Load(), Forwarded: f.forwarded.Load(),
		Backlog: f.backlog.Load(), BacklogBytes: f.backlogBytes.Load(),
		DroppedOldest: f.droppedOldest.Load(), Refused: f.refused.Load()}
}

// New returns the forwarder of cfg's connection over log, continuing the
// log's sequence after what it holds.
func New(cfg Config, log Log, logger *slog.Logger) (*Forwarder, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	msgs, bytes, _, last, err := log.ForwardStats(cfg.Name)
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	f := &Forwarder{cfg: cfg, log: log, slog: logger.With("forward", cfg.Name), next: last + 1, wake: make(chan struct{}, 1)}
	f.backlog.Store(int64(msgs))
	f.backlogBytes.Store(bytes)
	return f, nil
}

// Append stores a message for the upstream durably and returns once it
// is: from then on it gets there, at least once, whatever happens to the
// gateway or the upstream. A device's messages must be appended one after
// the other (the broker handles a client's publishes in order); they
// are then forwarded in that order.
func (f *Forwarder) Append(topic string, qos byte, retain bool, payload []byte) error {
	rec := appendRecord(nil, topic, qos, retain, payload)
	if f.cfg.MaxBytes > 0 && f.cfg.Overflow == RefuseNew && f.backlogBytes.Load()+int64(len(rec)) > f.cfg.MaxBytes {
		f.refused.Add(1)
		return ErrFull
	}
	f.mu.Lock()
	seq := f.next
	f.next++
	f.mu.Unlock()
	if err := f.log.AppendForward(f.cfg.Name, seq, rec); err != nil {
		return err
	}
	f.backlog.Add(1)
	f.backlogBytes.Add(int64(len(rec)))
	select {
	case f.wake <- struct{}{}:
	default:
	}
	return nil
}

// Connected reports whether the upstream connection is up.
func (f *Forwarder) Connected() bool { return f.connected.Load() }

// Forwarded returns how many messages the upstream acknowledged.
func (f *Forwarder) Forwarded() uint64 { return f.forwarded.Load() }

// Run connects to the upstream and forwards the log until ctx ends,
// reconnecting with backoff (and jitter) when the connection fails.
func (f *Forwarder) Run(ctx context.Context) {
	backoff := f.cfg.MinBackoff
	for ctx.Err() == nil {
		c, lost, err := f.connect(ctx)
		if err == nil {
			f.connected.Store(true)
			f.slog.Info("upstream connected", "addr", f.cfg.Addr)
			backoff = f.cfg.MinBackoff
			err = f.pump(ctx, c, lost)
			f.connected.Store(false)
			c.Disconnect(0)
		}
		if ctx.Err() != nil {
			return
		}
		f.slog.Warn("upstream unavailable; messages wait in the forward log", "addr", f.cfg.Addr, "error", err, "retry_in", backoff)
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
	wait:
		for {
			f.trim(nil)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-f.wake: // a message appended: keep within MaxBytes
			case <-t.C:
				break wait
			}
		}
		backoff = min(2*backoff, f.cfg.MaxBackoff)
	}
}

// connect opens the upstream connection; lost is closed when it ends.
func (f *Forwarder) connect(ctx context.Context) (mqtt.Client, <-chan struct{}, error) {
	lost := make(chan struct{})
	var once sync.Once
	opts := mqtt.NewClientOptions().
		AddBroker("tcp://" + f.cfg.Addr).
		SetClientID(f.cfg.ClientID).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetConnectTimeout(f.cfg.AckTimeout).
		SetKeepAlive(30 * time.Second).
		SetConnectionLostHandler(func(mqtt.Client, error) { once.Do(func() { close(lost) }) })
	if f.cfg.Username != "" {
		opts.SetUsername(f.cfg.Username).SetPassword(f.cfg.Password)
	}
	c, err := mqtt3.Connect(ctx, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", f.cfg.Addr, err)
	}
	if len(f.cfg.Subscribe) > 0 && f.cfg.Deliver != nil {
		filters := make(map[string]byte, len(f.cfg.Subscribe))
		for _, s := range f.cfg.Subscribe {
			filters[s] = 1
		}
		tok := c.SubscribeMultiple(filters, func(_ mqtt.Client, m mqtt.Message) {
			topic := f.local(m.Topic())
			if err := f.cfg.Deliver(topic, m.Payload(), m.Retained(), m.Qos()); err != nil {
				f.slog.Error("command from upstream not delivered", "topic", topic, "error", err)
			}
		})
		if !tok.WaitTimeout(f.cfg.AckTimeout) || tok.Error() != nil {
			c.Disconnect(0)
			return nil, nil, fmt.Errorf("subscribe upstream to %v: %v", f.cfg.Subscribe, tok.Error())
		}
	}
	return c, lost, nil
}

// inflight is a message sent and not yet acknowledged.
type inflight struct {
	seq  uint64
	size int // its record's bytes
	tok  mqtt.Token
}

// pump sends the log, oldest first, with up to Window messages in
// flight, and deletes what the upstream acknowledged, until the
// connection fails or ctx ends.
func (f *Forwarder) pump(ctx context.Context, c mqtt.Client, lost <-chan struct{}) error {
	var sent []inflight
	var last uint64         // the newest sequence number sent on this connection
	var headSince time.Time // when sent[0] became the oldest in flight
	for {
		f.trim(sent)
		if len(sent) < f.cfg.Window {
			var err error
			from := last + 1
			if len(sent) == 0 {
				from = 0 // everything left: a lower number may have committed late
			}
			err = f.log.ReadForward(f.cfg.Name, from, func(seq uint64, rec []byte) bool {
				topic, qos, retain, payload, err := decodeRecord(rec)
				if err != nil {
					f.slog.Error("forward log record unreadable; dropped", "seq", seq, "error", err)
					if f.log.DeleteForward(f.cfg.Name, []uint64{seq}) == nil {
						f.backlog.Add(-1)
						f.backlogBytes.Add(-int64(len(rec)))
					}
					return true
				}
				if len(sent) == 0 {
					headSince = time.Now()
				}
				sent = append(sent, inflight{seq, len(rec), c.Publish(f.remote(topic), min(qos, f.cfg.MaxQoS), retain, payload)})
				last = seq
				return len(sent) < f.cfg.Window
			})
			if err != nil {
				return err
			}
		}
		if len(sent) == 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-lost:
				return errors.New("connection lost")
			case <-f.wake:
			}
			continue
		}
		// New messages (wake) do not postpone the oldest one's deadline.
		t := time.NewTimer(f.cfg.AckTimeout - time.Since(headSince))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-lost:
			t.Stop()
			return errors.New("connection lost")
		case <-t.C:
			return fmt.Errorf("no acknowledgement within %s", f.cfg.AckTimeout)
		case <-f.wake:
			t.Stop()
			continue
		case <-sent[0].tok.Done():
			t.Stop()
		}
		// Acknowledged messages at the head of the window leave the log.
		var done []uint64
		var doneBytes int64
		for len(sent) > 0 && isDone(sent[0].tok) {
			if err := sent[0].tok.Error(); err != nil {
				return fmt.Errorf("publish: %w", err)
			}
			done = append(done, sent[0].seq)
			doneBytes += int64(sent[0].size)
			sent = sent[1:]
			headSince = time.Now()
		}
		if err := f.log.DeleteForward(f.cfg.Name, done); err != nil {
			return err
		}
		f.forwarded.Add(uint64(len(done)))
		f.backlog.Add(-int64(len(done)))
		f.backlogBytes.Add(-doneBytes)
	}
}

func isDone(t mqtt.Token) bool {
	select {
	case <-t.Done():
		return true
	default:
		return false
	}
}

// trim drops the oldest messages not in flight while the log holds more
// than MaxBytes under DropOldest. Called from Run's goroutine only.
func (f *Forwarder) trim(sent []inflight) {
	over := f.backlogBytes.Load() - f.cfg.MaxBytes
	if f.cfg.MaxBytes <= 0 || f.cfg.Overflow != DropOldest || over <= 0 {
		return
	}
	busy := make(map[uint64]bool, len(sent))
	for _, s := range sent {
		busy[s.seq] = true
	}
	var drop []uint64
	var bytes int64
	_ = f.log.ReadForward(f.cfg.Name, 0, func(seq uint64, rec []byte) bool {
		if !busy[seq] {
			drop = append(drop, seq)
			bytes += int64(len(rec))
		}
		return bytes < over
	})
	if len(drop) == 0 {
		return
	}
	if err := f.log.DeleteForward(f.cfg.Name, drop); err != nil {
		f.slog.Error("forward log full; the oldest messages could not be dropped", "error", err)
		return
	}
	f.backlog.Add(-int64(len(drop)))
	f.backlogBytes.Add(-bytes)
	f.droppedOldest.Add(uint64(len(drop)))
	if time.Since(f.fullLogged) >= 10*time.Second {
		f.fullLogged = time.Now()
		f.slog.Warn("forward log full; oldest messages dropped", "dropped_so_far", f.droppedOldest.Load(), "max_bytes", f.cfg.MaxBytes)
	}
}

// remote maps a local topic to the upstream's.
func (f *Forwarder) remote(topic string) string {
	if f.cfg.LocalPrefix != "" && strings.HasPrefix(topic, f.cfg.LocalPrefix) {
		return f.cfg.RemotePrefix + topic[len(f.cfg.LocalPrefix):]
	}
	return topic
}

// local maps an upstream topic back to the local one.
func (f *Forwarder) local(topic string) string {
	if f.cfg.RemotePrefix != "" && strings.HasPrefix(topic, f.cfg.RemotePrefix) {
		return f.cfg.LocalPrefix + topic[len(f.cfg.RemotePrefix):]
	}
	return topic
}

// recordVersion starts a forward log record: version, flags (QoS in the
// low two bits, retain in bit 2), the topic's length as a uvarint, the
// topic, the payload.
const recordVersion = 1

func appendRecord(b []byte, topic string, qos byte, retain bool, payload []byte) []byte {
	flags := qos & 3
	if retain {
		flags |= 4
	}
	b = append(b, recordVersion, flags)
	b = binary.AppendUvarint(b, uint64(len(topic)))
	b = append(b, topic...)
	return append(b, payload...)
}

func decodeRecord(b []byte) (topic string, qos byte, retain bool, payload []byte, err error) {
	if len(b) < 3 || b[0] != recordVersion {
		return "", 0, false, nil, errors.New("not a forward record of version 1")
	}
	n, k := binary.Uvarint(b[2:])
	if k <= 0 || uint64(len(b)-2-k) < n {
		return "", 0, false, nil, errors.New("forward record: bad topic length")
	}
	rest := b[2+k:]
	return string(rest[:n]), b[1] & 3, b[1]&4 != 0, rest[n:], nil
}
