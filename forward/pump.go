package forward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Run connects to the upstream and forwards the log until ctx ends,
// reconnecting with backoff (and jitter) when the connection fails. The
// same failure is logged at most once per failureLogEvery.
func (f *Forwarder) Run(ctx context.Context) {
	backoff := f.cfg.MinBackoff
	var logged string
	var loggedAt time.Time
	for ctx.Err() == nil {
		atOnce := false // the next attempt need not wait (see below)
		f.attempts.Add(1)
		dctx, cancel := context.WithTimeout(ctx, dialTimeout)
		dial := f.live.Load().Dial
		c, err := dial.Dial(dctx)
		cancel()
		if err == nil {
			f.setConnected(true, "")
			f.slog.Info("upstream connected", "addr", dial.Addr())
			acked, moved, since := f.forwarded.Load(), f.deadMoved.Load(), time.Now()
			err = f.pump(ctx, c)
			closeWithin(c, closeTimeout)
			// Only a connection that worked (a message acknowledged, or
			// refused for good) starts the backoff over: one that the
			// destination accepts and then fails at once (a produce
			// refused, a login taken back) would otherwise be retried
			// every MinBackoff, and logged each time.
			stable := time.Since(since) >= stableConnection
			progressed := f.forwarded.Load() > acked || f.deadMoved.Load() > moved
			if progressed || stable {
				logged = ""
				backoff = f.cfg.MinBackoff
			}
			// At once after a connection that lasted, or that set a
			// message aside (each such connection takes one out of
			// the log, so they end): an upstream that ends the
			// connection after each refusal (Mosquitto with
			// max_queued_messages 0) would otherwise hold the log to
			// a refusal per backoff. Not after acknowledgements
			// alone: an upstream that acknowledges a message and
			// drops every connection would be dialled again in a
			// loop; it gets the first step of the backoff.
			atOnce = stable || f.deadMoved.Load() > moved
		}
		if ctx.Err() != nil {
			f.setConnected(false, "")
			return
		}
		if f.setAsideClosing() {
			logged = ""
			backoff = f.cfg.MinBackoff // something moved on
			atOnce = true
		}
		f.setConnected(false, err.Error())
		if msg := err.Error(); msg != logged || time.Since(loggedAt) >= failureLogEvery {
			logged, loggedAt = msg, time.Now()
			f.slog.Warn("upstream unavailable; messages wait in the forward log", "addr", dial.Addr(), "error", err,
				"backlog", f.backlog.Load(), "retry_in", backoff)
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		if atOnce {
			wait = 0
		}
		f.setRetry(time.Now().Add(wait))
		t := time.NewTimer(wait)
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
		f.setRetry(time.Time{})
		backoff = min(2*backoff, f.cfg.MaxBackoff)
	}
}

// dialTimeout bounds a connection attempt, handshakes included (each
// destination's client has its own shorter timeouts; this bounds those
// that wait on the context alone).
const dialTimeout = 10 * time.Second

// closeTimeout is how long Run waits for a connection to close: a
// client's Close may wait on an upstream that stopped answering (a
// goodbye written, buffered records aborted); beyond it the close goes
// on in the background and Run carries on, so that a shutdown stays
// within its time.
const closeTimeout = time.Second

// closeWithin closes c, waiting at most d.
func closeWithin(c Conn, d time.Duration) {
	done := make(chan struct{})
	go func() { c.Close(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// stableConnection is how long a connection that acknowledged nothing
// must have lasted to count as having worked (see Run).
const stableConnection = 10 * time.Second

// failureLogEvery spaces the lines of a failure that repeats.
const failureLogEvery = time.Minute

// lost says why c ended: "connection lost", with the destination's
// reason when it gave one.
func lost(c Conn) error {
	if why := c.Reason(); why != nil {
		return fmt.Errorf("connection lost: %w", why)
	}
	return errors.New("connection lost")
}

// setRetry records when Run tries to connect again (zero: not waiting).
func (f *Forwarder) setRetry(at time.Time) {
	f.mu.Lock()
	f.retryAt = at
	f.mu.Unlock()
}

func (f *Forwarder) setConnected(up bool, why string) {
	f.mu.Lock()
	f.lastErr = why
	f.mu.Unlock()
	f.connected.Store(up)
}

// inflight is a message sent and not yet acknowledged.
type inflight struct {
	seq  uint64
	size int // its record's bytes
	ack  Ack
}

// queued is a message read from the log, not sent yet.
type queued struct {
	seq  uint64
	size int // its record's bytes
	m    Message
}

// expiryLeft returns what is left at now of m's MQTT 5 Message Expiry
// Interval, in whole seconds rounded up, and whether it has run out; 0
// and false when m has none. What is passed on carries the interval
// less the time the message waited here (MQTT 5, 3.3.2.3.3), and a
// message whose interval ran out is not passed on: its sender said it
// is of no use by then.
func expiryLeft(m *Message, now time.Time) (left uint32, expired bool) {
	if m.Props == nil || m.Props.MessageExpiry == 0 || m.At.IsZero() {
		return 0, false
	}
	rest := time.Duration(m.Props.MessageExpiry)*time.Second - now.Sub(m.At)
	if rest <= 0 {
		return 0, true
	}
	return uint32((rest + time.Second - 1) / time.Second), false
}

// readAhead reads up to Window messages of the log from sequence number
// from into queue (their topics mapped upstream, their bytes copied out
// of the file's memory), dropping the unreadable, the expired (their
// MQTT 5 Message Expiry Interval ran out: expiryLeft) and, under
// MaxAge, the too old. It returns the queue and the newest sequence number read.
func (f *Forwarder) readAhead(from, read uint64, queue []queued) ([]queued, uint64, error) {
	var drop []uint64
	var dropBytes int64
	type damaged struct {
		seq uint64
		rec []byte
		err error
	}
	var bad []damaged
	now, maxAge := f.cfg.Now(), f.live.Load().MaxAge
	err := f.log.ReadForward(f.cfg.Name, from, func(seq uint64, rec []byte) bool {
		read = seq
		err := checkRecord(seq, rec)
		var m Message
		if err == nil {
			m, err = decodeRecord(rec)
		}
		if err != nil {
			// Never forwarded as if sound: set aside with the dead
			// letters, counted as damaged.
			bad = append(bad, damaged{seq, bytes.Clone(rec), err})
			return true
		}
		if _, expired := expiryLeft(&m, now); expired || maxAge > 0 && !m.At.IsZero() && now.Sub(m.At) > maxAge {
			drop = append(drop, seq)
			dropBytes += int64(len(rec))
			f.expired.Add(1)
			return true
		}
		m.Topic = f.cfg.Map.Up(m.Topic)
		if m.ID == "" {
			m.ID = f.ownID(seq)
		}
		// rec is the file's memory, valid only during the read; the
		// connection writes the payload later.
		m.Payload = bytes.Clone(m.Payload)
		if m.Props != nil {
			m.Props.CorrelationData = bytes.Clone(m.Props.CorrelationData)
		}
		queue = append(queue, queued{seq, len(rec), m})
		return len(queue) < f.cfg.Window
	})
	if err != nil {
		return queue, read, err
	}
	for _, d := range bad {
		if err := f.moveDead(d.seq, d.rec, &RefusedError{Reason: "damaged", Err: d.err}); err != nil {
			return queue, read, err
		}
	}
	return queue, read, f.remove(drop, dropBytes)
}

// pump sends the log, oldest first, with up to Window messages in
// flight and at most Rate per second, drops the messages older than
// MaxAge when their turn comes, and deletes what the upstream
// acknowledged, until the connection fails or ctx ends.
func (f *Forwarder) pump(ctx context.Context, c Conn) (err error) {
	del := f.startDeleter()
	defer func() {
		// What this connection had acknowledged leaves the log before
		// the next connection reads it from the start.
		if derr := del.stop(); err == nil {
			err = derr
		}
	}()
	var sent []inflight
	// A connection that ends (not for want of an acknowledgement, nor
	// after a refusal, which Mosquitto ends the connection after) with
	// one message alone in flight ended after that message. Only alone:
	// a destination that closes the connection with more in flight may
	// have done so for any of them, and a close that loses what was on
	// its way (a TCP reset) loses the acknowledgements of those before
	// it too. A connection starts with one message in flight, so the
	// oldest is sent alone after each end.
	refused, timedOut := false, false
	began := time.Now()
	defer func() {
		// Only an end of the connection: a message the destination
		// fails and answers (a stream not created yet, Redis loading)
		// is sent again as ever.
		if ctx.Err() != nil || timedOut || !(isClosed(c.Lost()) || errors.Is(err, ErrEnded)) {
			return
		}
		if len(sent) == 1 && !refused {
			f.closedAfter(sent[0].seq)
		}
		// A connection lost soon after it began, with several messages
		// in flight: the next one sends them one at a time (see
		// careful).
		if len(sent) > 1 && time.Since(began) < stableConnection {
			f.careful = sent[len(sent)-1].seq
		}
	}()
	opensAt := f.careful
	// queue holds messages read from the log and not sent yet: the log
	// is read once per window's worth, not once per acknowledgement.
	var queue []queued
	var read uint64         // the newest sequence number read on this connection
	var headSince time.Time // when sent[0] became the oldest in flight
	live := f.live.Load()
	pace := newPacer(live.Rate)
	// A connection starts with one message in flight and opens its
	// window once the destination acknowledged one: a destination that
	// fails a window's first messages and stores later ones (a JetStream
	// stream created while they were on their way; Redis loading its
	// data) would otherwise have a device's later messages stored
	// before its earlier ones, which are sent again after them.
	window := 1
	h, batch := c.(holder)
	// full is the window once open: Window, or less when the
	// destination takes fewer unacknowledged (an MQTT 5 upstream's
	// Receive Maximum).
	full := f.cfg.Window
	if l, ok := c.(inflightLimiter); ok && l.MaxInflight() > 0 {
		full = min(full, l.MaxInflight())
	}
	for {
		if l := f.live.Load(); l != live {
			if l.Rate != live.Rate {
				pace = newPacer(l.Rate) // SetLive
			}
			live = l
		}
		if f.overBound() {
			if err := del.flush(); err != nil {
				return err
			}
			f.trim(sent)
			// trim may have dropped what the queue holds: read again.
			queue, read = nil, 0
			if len(sent) > 0 {
				read = sent[len(sent)-1].seq
			}
		}
		if len(queue) == 0 && len(sent) < window {
			// On from the newest number read: every message before it
			// was sent on this connection, or left the log (expired,
			// trimmed, set aside), and the log never holds a number
			// before a lower one (AppendAsync), so nothing before it
			// waits. The deleter is not waited for: what it still
			// deletes was acknowledged and is never read again here.
			// Before, a connection with nothing in flight waited for
			// the deletion's fsync and read from the log's start, at
			// every window a fast upstream emptied.
			from := read + 1
			if read == 0 {
				// The connection's first read (or the first after a
				// trim with nothing in flight): from the log's start,
				// once what was acknowledged has left it.
				if err := del.flush(); err != nil {
					return err
				}
				from = 0
			}
			var err error
			if queue, read, err = f.readAhead(from, read, queue); err != nil {
				return err
			}
		}
		var paceWait time.Duration
		// A batch of at least minHeld leaves in one write; fewer go as
		// they come (a message or two freed by an acknowledgement).
		held := batch && min(len(queue), window-len(sent)) >= minHeld
		if held {
			h.Hold()
		}
		for len(queue) > 0 && len(sent) < window && !isClosed(c.Lost()) {
			if paceWait = pace.wait(time.Now()); paceWait > 0 {
				break
			}
			q := &queue[0]
			if len(sent) == 0 {
				headSince = time.Now()
			}
			if left, _ := expiryLeft(&q.m, f.cfg.Now()); left > 0 {
				q.m.Props.MessageExpiry = left
			}
			if len(sent) == 0 {
				f.waiting.CompareAndSwap(0, time.Now().UnixNano())
			}
			a := c.Send(&q.m, min(q.m.QoS, f.cfg.MaxQoS))
			sent = append(sent, inflight{q.seq, q.size, a})
			queue = queue[1:]
			if failedNow(a) || isClosed(c.Lost()) {
				break // no more on a connection that failed: each Send may take up to its write deadline
			}
		}
		if held {
			h.Release()
		}
		var paced <-chan time.Time
		if paceWait > 0 {
			paced = time.After(paceWait) // collected unfired (Go 1.23 timers)
		}
		if len(sent) == 0 {
			if len(queue) == 0 {
				f.waiting.Store(0)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-c.Lost():
				return lost(c)
			case <-f.wake:
			case <-paced:
			}
			continue
		}
		// New messages (wake) do not postpone the oldest one's deadline.
		t := time.NewTimer(f.cfg.AckTimeout - time.Since(headSince))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-c.Lost():
			t.Stop()
			if !isDone(sent[0].ack) {
				return lost(c)
			}
			// The oldest's answer came before the end (a refusal the
			// destination closes the connection after): taken first.
		case <-t.C:
			timedOut = true
			return fmt.Errorf("no acknowledgement within %s", f.cfg.AckTimeout)
		case <-f.wake:
			t.Stop()
			continue
		case <-paced:
			t.Stop()
			continue
		case <-sent[0].ack.Done():
			t.Stop()
		case err := <-del.failed:
			t.Stop()
			return err
		}
		// Acknowledged messages at the head of the window leave the log.
		var done []uint64
		var doneBytes int64
		for len(sent) > 0 && isDone(sent[0].ack) {
			if err := sent[0].ack.Error(); err != nil {
				var ref *RefusedError
				if !errors.As(err, &ref) {
					if !errors.Is(err, ErrEnded) {
						f.countAhead(c, sent[1:])
					}
					return fmt.Errorf("publish: %w", err)
				}
				// Refused for good: to the dead letters, and on.
				if sent[0].seq >= opensAt {
					window = full // an answer all the same
				}
				refused = true
				if err := f.deadLetter(sent[0].seq, ref); err != nil {
					return err
				}
				sent = sent[1:]
				headSince = time.Now()
				continue
			}
			if sent[0].seq >= opensAt {
				window = full
			}
			if f.closes.seq == sent[0].seq {
				f.closes.n = 0
			}
			done = append(done, sent[0].seq)
			doneBytes += int64(sent[0].size)
			sent = sent[1:]
			headSince = time.Now()
		}
		switch {
		case len(sent) == 0:
			f.waiting.Store(0)
		case len(done) > 0:
			f.waiting.Store(time.Now().UnixNano())
		}
		del.add(done, doneBytes)
	}
}

// holder is a Conn that can keep back what its Sends write and write
// it together (MQTT: batchConn.Hold). The pump holds while it sends a
// batch; Release never waits.
type holder interface {
	Hold()
	Release()
}

// minHeld is the fewest messages the pump sends under Hold: holding one
// or two gains no syscall (the client's writer may take the last ones
// after Release anyway) and may cost a goroutine when a write is under
// way.
const minHeld = 8

// inflightLimiter is a Conn whose destination takes at most
// MaxInflight messages unacknowledged (MQTT 5: the upstream's Receive
// Maximum).
type inflightLimiter interface{ MaxInflight() int }

// overBound reports whether the log holds more than its bound under
// DropOldest (trim has work): MaxBytes, or less while the disk is at
// its free-space floor (bound).
func (f *Forwarder) overBound() bool {
	if f.cfg.Overflow != DropOldest {
		return false
	}
	b, _ := f.bound()
	return b > 0 && f.backlogBytes.Load() > b
}

// remove deletes messages from the log and the backlog counts.
func (f *Forwarder) remove(seqs []uint64, bytes int64) error {
	if len(seqs) == 0 {
		return nil
	}
	if err := f.log.DeleteForward(f.cfg.Name, seqs); err != nil {
		return err
	}
	f.backlog.Add(-int64(len(seqs)))
	f.backlogBytes.Add(-bytes)
	return nil
}

// failedNow reports whether a has already failed.
func failedNow(a Ack) bool { return isDone(a) && a.Error() != nil }

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func isDone(a Ack) bool {
	select {
	case <-a.Done():
		return true
	default:
		return false
	}
}

// trim drops the oldest messages not in flight while the log holds more
// than its bound under DropOldest. Called from Run's goroutine only.
func (f *Forwarder) trim(sent []inflight) {
	if f.cfg.Overflow != DropOldest {
		return
	}
	bound, floor := f.bound()
	over := f.backlogBytes.Load() - bound
	if bound <= 0 || over <= 0 {
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
	if err := f.remove(drop, bytes); err != nil {
		f.slog.Error("forward log full; the oldest messages could not be dropped", "error", err)
		return
	}
	if len(drop) == 0 {
		return
	}
	f.droppedOldest.Add(uint64(len(drop)))
	if floor {
		f.lowSpace.Add(int64(len(drop)))
	}
	if time.Since(f.fullLogged) >= 10*time.Second {
		f.fullLogged = time.Now()
		f.slog.Warn("forward log full; oldest messages dropped", "dropped_so_far", f.droppedOldest.Load(), "max_bytes", f.live.Load().MaxBytes)
	}
}

// pacer spaces sends to a rate, allowing a burst of a tenth of a
// second's worth (at least one message) after a pause: over any
// interval d, at most rate*d + burst messages go.
type pacer struct {
	interval time.Duration // between two messages; 0: no pacing
	burst    time.Duration // how far behind now the schedule may fall
	next     time.Time     // when the next message is due
}

func newPacer(rate float64) *pacer {
	if rate <= 0 {
		return &pacer{}
	}
	iv := time.Duration(float64(time.Second) / rate)
	return &pacer{interval: iv, burst: max(iv, 100*time.Millisecond)}
}

// wait returns 0 and takes a slot when a message may go now, or how long
// until one may.
func (p *pacer) wait(now time.Time) time.Duration {
	if p.interval == 0 {
		return 0
	}
	if p.next.Before(now.Add(-p.burst)) {
		p.next = now.Add(-p.burst)
	}
	if d := p.next.Sub(now); d > 0 {
		return d
	}
	p.next = p.next.Add(p.interval)
	return 0
}

// Map maps topics between the gateway and an upstream: a topic starting
// with Local goes upstream starting with Remote instead, and back.
type Map struct{ Local, Remote string }

// Up maps a local topic to the upstream's.
func (m Map) Up(topic string) string {
	if m.Local != "" && strings.HasPrefix(topic, m.Local) {
		return m.Remote + topic[len(m.Local):]
	}
	return topic
}

// Down maps an upstream topic back to the local one.
func (m Map) Down(topic string) string {
	if m.Remote != "" && strings.HasPrefix(topic, m.Remote) {
		return m.Local + topic[len(m.Remote):]
	}
	return topic
}
