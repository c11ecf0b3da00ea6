package simulator

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// clientCount is what the run counts per client beside the devices'
// logs. Safe for concurrent use.
type clientCount struct {
	wire wireCount
	// wanted counts the messages the devices wanted to send (their
	// schedule's), superseded those an adaptive device dropped because
	// a newer reading on the same path replaced it before it could go.
	wanted, superseded atomic.Int64
}

// adaptive runs device i on c, an adaptive client, until ctx ends. The
// device wants to send on the same schedule as a naive one (Rate,
// Pattern, TopicClasses), but a message goes only when the pacer allows
// it; until then the latest wanted message of each path (the device's
// own topic, each topic class) waits, a newer one replacing it, as a
// sensor sends its latest reading. Paths wait apart: a class held back
// does not hold back the device's own messages.
func (f *fleet) adaptive(ctx context.Context, i int, id string, c *clientLean) {
	cfg, rec := &f.cfg, f.rec
	cc := f.clients[ClientAdaptive]
	pc := newPacer()
	takePolicy := func() {
		fb := c.feedback
		if !fb.policyChanged {
			return
		}
		fb.policyChanged = false
		if fb.policy == "" {
			rec.mu.Lock()
			rec.note(errors.New("adaptive devices: CONNACK carries no RateLimit-Policy (the gateway gives no feedback, or it is off for their quota)"))
			rec.mu.Unlock()
			return
		}
		ps, err := ParseRatePolicies(fb.policy)
		if err != nil {
			rec.mu.Lock()
			rec.note(fmt.Errorf("device %s: %w", id, err))
			rec.mu.Unlock()
			return
		}
		pc.policies(ps)
	}
	takePolicy()

	// Paths: the device's own topic first, then each class's.
	paths := []string{""}
	topics := []string{fmt.Sprintf(cfg.Topic, id)}
	for _, tc := range cfg.TopicClasses {
		paths = append(paths, tc.Name)
		topics = append(topics, fmt.Sprintf(tc.Topic, id))
	}
	pending := make([]bool, len(paths))
	pathOf := func(want uint64) int {
		_, class := cfg.ClassTopic(want)
		for k, p := range paths {
			if p == class {
				return k
			}
		}
		return 0
	}

	sch := &schedule{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, uint64(i))), flood: i < cfg.Flood}
	start := time.Now()
	wantOff := sch.next(0)
	var want, seq uint64
	buf := make([]byte, 0, max(cfg.PayloadSize, headerFixed+len(id)))
	for {
		now := time.Now()
		for !start.Add(wantOff).After(now) {
			k := pathOf(want)
			if pending[k] {
				cc.superseded.Add(1)
			}
			pending[k] = true
			cc.wanted.Add(1)
			want++
			wantOff = sch.next(wantOff)
		}
		// The pending path ready first goes; else wait for the next
		// want or the first pending path to be ready.
		next, send := start.Add(wantOff), -1
		for k, ok := range pending {
			if !ok {
				continue
			}
			at := pc.ready(paths[k])
			if !at.After(now) && (send < 0 || at.Before(pc.ready(paths[send]))) {
				send = k
			}
			if at.Before(next) {
				next = at
			}
		}
		if send < 0 {
			ok, err := waitToSend(ctx, c, next)
			if !ok {
				return
			}
			if err != nil {
				f.deviceEnded(ctx, id, err)
				return
			}
			continue
		}
		pending[send] = false
		payload := AppendHeader(buf[:0], Header{Device: id, Seq: seq, Sent: now}, cfg.PayloadSize)
		ack, code, err := c.publish(ctx, topics[send], payload)
		var ackAt time.Time
		if ack != AckNone {
			ackAt = time.Now()
		}
		rec.sent(id, Sent{Seq: seq, At: now, Ack: ack, Code: code, AckAt: ackAt, Size: len(payload), Class: paths[send]})
		seq++
		if err != nil {
			f.deviceEnded(ctx, id, err)
			return
		}
		takePolicy()
		var items []RateRemaining
		if v := c.feedback.rateLimit; v != "" {
			if items, err = ParseRateRemaining(v); err != nil {
				rec.mu.Lock()
				rec.note(fmt.Errorf("device %s: %w", id, err))
				rec.mu.Unlock()
			}
		}
		pc.observe(paths[send], items, len(payload), ackAt)
	}
}

// deviceEnded records why a device's connection ended before the run
// did: blocked by the gateway (not a fault), or a failure.
func (f *fleet) deviceEnded(ctx context.Context, id string, err error) {
	switch {
	case ctx.Err() != nil:
	case errors.Is(err, ErrBlocked):
		f.rec.blockedDevice(id)
	default:
		f.rec.fail(fmt.Errorf("device %s: %w", id, err), false)
	}
}
