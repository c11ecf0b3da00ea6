// Package forward hands admitted device messages on to an upstream (an
// MQTT broker today), through a durable forward log: a message is
// appended (and fsynced, in the store's group commit) before the device
// is acknowledged, and leaves the log only once the upstream
// acknowledged it. A connection lost, a broker that stops answering or a
// gateway killed costs nothing acknowledged: the log is sent again from
// its start, in order (at least once; duplicates only from what was in
// flight).
//
// One Forwarder serves one upstream connection and its own log; a
// device always goes through the same one (Set), so its messages reach
// the upstream in the order the gateway accepted them.
package forward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/devicegate/devicegate/persist"
)

// Log is the durable forward log (persist.Store).
type Log interface {
	// AppendForwardAsync queues rec; its Queued's Wait returns once it
	// is durable. Records are committed in the order they are queued.
	AppendForwardAsync(log string, seq uint64, rec []byte) (persist.Queued, error)
	// ReplayDeadAsync is AppendForwardAsync whose transaction also
	// deletes dead letter dead: the message is in one log or the other.
	ReplayDeadAsync(log string, dead, seq uint64, rec []byte) (persist.Queued, error)
	ReadForward(log string, from uint64, fn func(seq uint64, rec []byte) bool) error
	DeleteForward(log string, seqs []uint64) error
	ForwardStats(log string) (messages int, bytes int64, first, last uint64, err error)
	// MoveForwardDead moves message seq to the log's dead letters, as
	// entry, in one transaction, keeping at most max of them (the
	// oldest go; dropped says how many).
	MoveForwardDead(log string, seq uint64, entry []byte, max int) (dropped int, err error)
	// ReadDead reads the dead letters from number from on.
	ReadDead(log string, from uint64, fn func(seq uint64, entry []byte) bool) error
	// DeleteDead deletes dead letters seqs, all or (one not held:
	// persist.ErrNotHeld) none.
	DeleteDead(log string, seqs []uint64) error
	DeadCount(log string) (int, error)
	// SpaceLow reports that the data file's disk is at its free-space
	// floor: appends would be refused (floor.go).
	SpaceLow() bool
}

// Conn is one connection to an upstream, as a forwarder drives it.
type Conn interface {
	// Send hands m on at qos (its topic already mapped for the
	// upstream); the Ack completes when the upstream has it (at once
	// for QoS 0, once written).
	Send(m *Message, qos byte) Ack
	// Lost is closed when the connection ends; Reason then says why
	// (nil when the destination did not say). Embedding *Ending
	// provides both.
	Lost() <-chan struct{}
	Reason() error
	// Close ends the connection.
	Close()
}

// Ack is the completion of one Send (a paho token is one).
type Ack interface {
	Done() <-chan struct{}
	Error() error
}

// Dialer opens connections to one upstream.
type Dialer interface {
	Dial(ctx context.Context) (Conn, error)
	// Addr names the upstream in logs.
	Addr() string
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
	// Origin, when set, starts every message ID ("ORIGIN/NAME/SEQ"):
	// the data file's (persist.Store.Origin), so that two gateways
	// forwarding under the same name never send two messages alike.
	Origin string
	// Upstream names the upstream the connection belongs to, for
	// metrics; Name when empty.
	Upstream string
	// Dial opens the connection.
	Dial Dialer
	// Map maps topics between the gateway and the upstream.
	Map Map
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
	// MaxAge, when set, is how old a message may be when its turn to be
	// sent comes; an older one is dropped (counted), never sent late.
	MaxAge time.Duration
	// Rate, when set, bounds the messages sent per second (backlog and
	// live together), with bursts of at most a tenth of a second's
	// worth.
	Rate float64
	// MinBackoff and MaxBackoff bound the wait between connection
	// attempts, doubled after each failure, with jitter (defaults 100 ms
	// and DefaultMaxBackoff).
	MinBackoff, MaxBackoff time.Duration
	// Now is the clock of acceptance times and MaxAge (time.Now when
	// nil).
	Now func() time.Time
	// DeadAfterCloses, when > 0, sets a message aside with the dead
	// letters (reason connection_closed) once that many connections in
	// a row ended with it the oldest unacknowledged: a destination that
	// closes the connection instead of refusing the message would
	// otherwise get it again on every connection.
	DeadAfterCloses int
}

// Live is what of a connection's Config a running forwarder takes anew
// (SetLive): Dial for the next connection attempt (the connection up
// stays as it is), Rate, MaxAge and MaxBytes at once.
type Live struct {
	Dial     Dialer
	Rate     float64
	MaxAge   time.Duration
	MaxBytes int64
}

// DefaultMaxBackoff is the longest wait between connection attempts by
// default. A wait at the cap is drawn from its second half, so once the
// destination is back the gateway reconnects at most that much later,
// about 4 s on average (a uniform wait of 5 to 10 s, entered at a
// random instant); at the former 30 s the outage runs of make
// bench-forward reconnected 3 to 13 s late. An attempt a destination
// refuses costs it one TCP connection.
const DefaultMaxBackoff = 10 * time.Second

func (c *Config) defaults() error {
	switch {
	case c.Name == "":
		return errors.New("forward: a connection needs a name")
	case c.Dial == nil:
		return fmt.Errorf("forward %s: no upstream to dial", c.Name)
	case c.MaxQoS > 1:
		return fmt.Errorf("forward %s: max QoS must be 0 or 1 (got %d)", c.Name, c.MaxQoS)
	case c.Rate < 0:
		return fmt.Errorf("forward %s: rate must be > 0 (got %g)", c.Name, c.Rate)
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
		c.MaxBackoff = max(DefaultMaxBackoff, c.MinBackoff)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Forwarder forwards one upstream connection's log. Build it with New,
// feed it with Append, run it with Run.
type Forwarder struct {
	cfg      Config
	log      Log
	slog     *slog.Logger
	idPrefix string // of message IDs: "ORIGIN/NAME/" or "NAME/"

	// live is Config's Dial, Rate, MaxAge and MaxBytes as in force:
	// cfg's, or the latest SetLive's.
	live atomic.Pointer[Live]

	mu      sync.Mutex
	next    uint64 // the next message's sequence number
	lastErr string // why the connection is down; "" when up
	// retryAt is when Run tries to connect again, while it waits; zero
	// otherwise.
	retryAt time.Time
	wake    chan struct{}

	connected atomic.Bool
	// waiting is when the upstream was last seen answering while
	// something waited for it (Unix nanoseconds): set when a message
	// goes out with nothing in flight, moved on by each
	// acknowledgement, 0 while nothing waits. A reconnection leaves it:
	// what was in flight waits still.
	waiting   atomic.Int64
	attempts  atomic.Uint64 // connection attempts
	forwarded atomic.Uint64 // messages the upstream acknowledged
	// backlog and backlogBytes count what the log holds: what it held
	// at New, plus appends, less what left it. Only Run's goroutine and
	// the deleter of its pump delete, one at a time (the pump flushes
	// the deleter before it trims), so the counts stay exact.
	backlog, backlogBytes atomic.Int64
	// droppedOldest, refused and expired count the messages that never
	// went: dropped for room, refused when full, too old when their
	// turn came.
	droppedOldest, refused, expired atomic.Uint64
	fullLogged                      time.Time    // Run's goroutine: the last "log full" line
	refusedLogged                   atomic.Int64 // Unix nanoseconds of the last "new messages refused" line
	// lowSpace counts the messages refused or dropped for room because
	// the disk was at its floor; floorBound is, while it is under
	// DropOldest, the most record bytes the log may hold (0: none).
	lowSpace, floorBound atomic.Int64
	dead                 deadCounts
	// reordered counts the messages the destination acknowledged after
	// an earlier one of their connection had failed (countAhead).
	reordered atomic.Uint64
	closes    closes // Run's goroutine only
	// careful is, after a connection lost soon after it began with
	// several messages in flight, the newest of them: the next
	// connections send one message at a time until it is answered, so
	// that a message the destination ends the connection after (and
	// whose answer, and those before it, the close lost: a TCP reset)
	// goes alone, is refused or counted (dead_after_closes), and the
	// rest flows. Run's goroutine only.
	careful uint64
	// deadMoved counts the messages moved to the dead letters since
	// start (a connection that moved one made progress).
	deadMoved atomic.Uint64
}

// Stats is a forwarder's state for metrics and the admin API.
type Stats struct {
	Upstream string // the upstream's name
	// Connections counts the upstream's connections, Connected those up.
	Connections, Connected int
	LastError              string // why a connection is down ("" when none is, or none tried yet)
	// RetryIn is, while a connection waits to try again, how long until
	// it does (the soonest of the upstream's); 0 otherwise.
	RetryIn      time.Duration
	Forwarded    uint64 // acknowledged by the upstream since start
	Backlog      int64  // messages in the forward log
	BacklogBytes int64  // their record bytes
	// OldestAge is how long the oldest message in the log has waited
	// (0 when the log is empty or its time is unknown).
	OldestAge time.Duration
	// DroppedOldest, Refused and Expired count the messages that never
	// went: the oldest dropped for room, the new refused, the too old.
	DroppedOldest, Refused, Expired uint64
	// LowSpace counts those of DroppedOldest and Refused that went
	// because the data file's disk was at its free-space floor
	// (persist.min_free_bytes).
	LowSpace uint64
	// DeadLetters is how many messages the dead-letter logs hold;
	// DeadByReason counts those moved there since start, by reason;
	// DeadDropped those dropped from a full dead-letter log.
	DeadLetters  int
	DeadByReason map[string]uint64
	DeadDropped  uint64
	// Reordered counts the messages the destination stored ahead of an
	// earlier message of their connection that had failed (sent again
	// after them): see docs/forwarding-failures.md, Order.
	Reordered uint64
}

// Stats returns the forwarder's state.
func (f *Forwarder) Stats() Stats {
	f.mu.Lock()
	lastErr, retryAt := f.lastErr, f.retryAt
	f.mu.Unlock()
	s := Stats{Upstream: f.cfg.Upstream, Connections: 1, LastError: lastErr, Forwarded: f.forwarded.Load(),
		Backlog: f.backlog.Load(), BacklogBytes: f.backlogBytes.Load(),
		DroppedOldest: f.droppedOldest.Load(), Refused: f.refused.Load(), Expired: f.expired.Load(), LowSpace: uint64(f.lowSpace.Load()),
		Reordered: f.reordered.Load()}
	f.dead.mu.Lock()
	s.DeadLetters, s.DeadDropped = f.dead.held, f.dead.dropped
	for r, n := range f.dead.byReason {
		if s.DeadByReason == nil {
			s.DeadByReason = map[string]uint64{}
		}
		s.DeadByReason[r] = n
	}
	f.dead.mu.Unlock()
	if f.connected.Load() {
		s.Connected = 1
		if since := f.silentFor(); since >= f.cfg.AckTimeout {
			// A connection is up only when the upstream answers: one
			// that takes messages and acknowledges nothing is not.
			s.Connected = 0
			s.LastError = fmt.Sprintf("connected, but nothing acknowledged for %s (acknowledgement timeout %s)",
				since.Round(time.Second), f.cfg.AckTimeout)
		}
	}
	if !retryAt.IsZero() {
		s.RetryIn = max(time.Until(retryAt), time.Nanosecond) // due: 0 would read as "not waiting"
	}
	if s.Backlog > 0 {
		_ = f.log.ReadForward(f.cfg.Name, 0, func(_ uint64, rec []byte) bool {
			if m, err := decodeRecord(rec); err == nil && !m.At.IsZero() {
				s.OldestAge = max(f.cfg.Now().Sub(m.At), 0)
			}
			return false
		})
	}
	return s
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
	f := &Forwarder{cfg: cfg, log: log, slog: logger.With("forward", cfg.Name), next: last + 1, wake: make(chan struct{}, 1),
		idPrefix: cfg.Name + "/"}
	if cfg.Origin != "" {
		f.idPrefix = cfg.Origin + "/" + f.idPrefix
	}
	if f.dead.held, err = log.DeadCount(cfg.Name); err != nil {
		return nil, err
	}
	if err := f.loadAgain(); err != nil {
		return nil, err
	}
	f.backlog.Store(int64(msgs))
	f.backlogBytes.Store(bytes)
	f.live.Store(&Live{Dial: cfg.Dial, Rate: cfg.Rate, MaxAge: cfg.MaxAge, MaxBytes: cfg.MaxBytes})
	return f, nil
}

// Live returns the Live settings in force.
func (f *Forwarder) Live() Live { return *f.live.Load() }

// SetLive puts l in force: a new dialer (new credentials) for the next
// connection attempt, the connection up keeping its own until it ends;
// the rate from the next message sent; MaxAge from the next message
// whose turn comes; MaxBytes from the next append (a lowered bound
// trims the log at once under DropOldest). An invalid l changes nothing.
func (f *Forwarder) SetLive(l Live) error {
	switch {
	case l.Dial == nil:
		return fmt.Errorf("forward %s: no upstream to dial", f.cfg.Name)
	case l.Rate < 0 || l.MaxAge < 0 || l.MaxBytes < 0:
		return fmt.Errorf("forward %s: rate, max age and max bytes must be >= 0 (got %g, %s, %d)", f.cfg.Name, l.Rate, l.MaxAge, l.MaxBytes)
	}
	f.live.Store(&l)
	select {
	case f.wake <- struct{}{}: // the pump and Run's wait look again
	default:
	}
	return nil
}

// Append stores a message for the upstream durably and returns once it
// is: from then on it gets there, at least once, whatever happens to the
// gateway or the upstream. m.At is set to now when zero. A device's
// messages must be appended one after the other (the broker handles a
// client's publishes in order); they are then forwarded in that order.
func (f *Forwarder) Append(m *Message) error {
	q, err := f.AppendAsync(m)
	if err != nil {
		return err
	}
	return q.Wait()
}

// AppendAsync is Append without the wait: the message is queued for the
// store's next group commit, in order after the device's earlier ones,
// and the Queued returned says when it is durable. Until then the
// message is not acknowledged to anyone.
func (f *Forwarder) AppendAsync(m *Message) (Queued, error) {
	return f.appendAsync(m, 0)
}

// Queued is a message queued for the forward logs' group commit
// (Forwarder.AppendAsync, Set.ForwardAsync), in one upstream's log or
// several. Its Wait must be called once; queueing it allocates nothing
// of its own when one upstream takes the message.
type Queued struct {
	f    *Forwarder // nil: no log holds the message (None)
	q    persist.Queued
	size int64    // the record's bytes, counted in f's backlog
	more []Queued // the other upstreams' (Set.ForwardAsync)
}

// None reports that no upstream takes the message: nothing was queued.
func (q Queued) None() bool { return q.f == nil }

// Ready reports, without waiting, whether every transaction holding
// the message has ended: Wait then waits for no commit. Only before
// Wait.
func (q Queued) Ready() bool {
	if q.f != nil && !q.q.Ready() {
		return false
	}
	for _, m := range q.more {
		if !m.Ready() {
			return false
		}
	}
	return true
}

// Wait, called once, returns when every log holds the message durably;
// an error means at least one does not (the first error).
func (q Queued) Wait() error {
	var first error
	if q.f != nil {
		first = q.f.durable(q.q, q.size)
	}
	for _, m := range q.more {
		if err := m.Wait(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// durable waits for q, the append of size record bytes, and counts it.
func (f *Forwarder) durable(q persist.Queued, size int64) error {
	if err := q.Wait(); err != nil {
		f.backlogBytes.Add(-size)
		return f.appendFailed(err)
	}
	f.backlog.Add(1)
	select {
	case f.wake <- struct{}{}:
	default:
	}
	return nil
}

// appendAsync is AppendAsync of a dead letter's message when dead is
// not 0: the transaction that appends it takes dead letter dead.
func (f *Forwarder) appendAsync(m *Message, dead uint64) (Queued, error) {
	if m.At.IsZero() {
		m.At = f.cfg.Now()
	}
	if err := f.atFloor(); err != nil {
		return Queued{}, err
	}
	rec := appendRecord(nil, m)
	maxBytes := f.live.Load().MaxBytes
	f.mu.Lock()
	if maxBytes > 0 && f.cfg.Overflow == RefuseNew && f.backlogBytes.Load()+int64(len(rec)) > maxBytes {
		f.mu.Unlock()
		n := f.refused.Add(1)
		// Logged like a full log under drop_oldest: at most once per 10 s.
		now := time.Now().UnixNano()
		if last := f.refusedLogged.Load(); now-last >= int64(10*time.Second) && f.refusedLogged.CompareAndSwap(last, now) {
			f.slog.Warn("forward log full; new messages refused (overflow: refuse_new)", "refused_so_far", n, "max_bytes", maxBytes)
		}
		return Queued{}, ErrFull
	}
	// Queued for the commit under the lock that numbers it: the store
	// commits in the order it queues, so the log never holds a number
	// before a lower one (TestLogHasNoGaps), and the pump, reading on
	// from the newest number it read, misses nothing. Queueing does not
	// wait for the commit.
	seal(rec, f.next)
	var q persist.Queued
	var err error
	if dead == 0 {
		q, err = f.log.AppendForwardAsync(f.cfg.Name, f.next, rec)
	} else {
		q, err = f.log.ReplayDeadAsync(f.cfg.Name, dead, f.next, rec)
	}
	if err != nil {
		f.mu.Unlock()
		return Queued{}, err
	}
	f.next++
	// Counted before the write so that concurrent appends see each
	// other against MaxBytes; taken back if the write fails.
	f.backlogBytes.Add(int64(len(rec)))
	f.mu.Unlock()
	return Queued{f: f, q: q, size: int64(len(rec))}, nil
}

// silentFor returns how long messages have waited for the upstream
// without an acknowledgement (0 when none waits).
func (f *Forwarder) silentFor() time.Duration {
	w := f.waiting.Load()
	if w == 0 {
		return 0
	}
	return time.Since(time.Unix(0, w))
}

// Connected reports whether the upstream connection is up (Stats, in
// Connected, also asks that it answers).
func (f *Forwarder) Connected() bool { return f.connected.Load() }

// Name returns the name of the forwarder's log ("NAME/0").
func (f *Forwarder) Name() string { return f.cfg.Name }

// Attempts returns how many times the forwarder tried to connect.
func (f *Forwarder) Attempts() uint64 { return f.attempts.Load() }

// Forwarded returns how many messages the upstream acknowledged.
func (f *Forwarder) Forwarded() uint64 { return f.forwarded.Load() }
