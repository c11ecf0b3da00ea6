package simulator

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Faults are the disturbances a run injects. The zero value injects
// none.
type Faults struct {
	// StormAt, when > 0, is the offset from the start of the run at
	// which every device drops its connection and reconnects at once (a
	// reconnect storm). Windows live in the gateway, not in the
	// connection: the quota must hold across it.
	StormAt time.Duration `json:"storm_at_ns,omitempty"`
	// RestartAt, when > 0, is the offset at which Restart is called.
	// Devices that lose their connection meanwhile wait until Restart
	// has returned and the subscriber is back, then reconnect and carry
	// on with their schedule (messages due meanwhile are skipped, not
	// sent in a burst).
	RestartAt time.Duration `json:"restart_at_ns,omitempty"`
	// Restart restarts the gateway at Addr and returns once it listens
	// again; the caller knows how (a child process, an embedded one).
	Restart func(ctx context.Context) error `json:"-"`
	// RestartMode names the restart for the report ("sigterm",
	// "kill -9", ...).
	RestartMode string `json:"restart_mode,omitempty"`
	// CrashLoss is how much of its recent admissions the gateway may
	// forget at the restart: 0 for a graceful one, about the snapshot
	// interval for kill -9. Each device may then exceed its quota by as
	// many messages as reached the subscriber in the CrashLoss (plus
	// Tolerance) before the restart (DeviceLog.Allowance); more is a
	// violation.
	CrashLoss time.Duration `json:"crash_loss_ns,omitempty"`
	// UpstreamOutageAt, when > 0, is the offset at which the link from
	// the gateway to the upstream it forwards to (SubAddr) goes down,
	// for UpstreamOutageFor, through UpstreamOutage (down, then up).
	// Devices keep publishing; the gateway keeps what it acknowledged
	// and sends it once the link is back.
	UpstreamOutageAt  time.Duration   `json:"upstream_outage_at_ns,omitempty"`
	UpstreamOutageFor time.Duration   `json:"upstream_outage_for_ns,omitempty"`
	UpstreamOutage    func(down bool) `json:"-"`
}

func (f Faults) validate(duration time.Duration) error {
	bad := func(field string, v any, why string) error {
		return fmt.Errorf("%w: %s: %s (got %v)", ErrInvalidConfig, field, why, v)
	}
	switch {
	case f.StormAt < 0 || f.StormAt >= duration && f.StormAt > 0:
		return bad("storm_at", f.StormAt, "must be within the duration")
	case f.RestartAt < 0 || f.RestartAt >= duration && f.RestartAt > 0:
		return bad("restart_at", f.RestartAt, "must be within the duration")
	case f.RestartAt > 0 && f.Restart == nil:
		return bad("restart_at", f.RestartAt, "needs a gateway the simulator can restart")
	case f.CrashLoss < 0:
		return bad("crash_loss", f.CrashLoss, "must be >= 0")
	case f.UpstreamOutageAt < 0 || f.UpstreamOutageAt >= duration && f.UpstreamOutageAt > 0:
		return bad("upstream_outage_at", f.UpstreamOutageAt, "must be within the duration")
	case f.UpstreamOutageAt > 0 && (f.UpstreamOutageFor <= 0 || f.UpstreamOutage == nil):
		return bad("upstream_outage_for", f.UpstreamOutageFor, "an upstream outage needs a length > 0 and an upstream the simulator can cut")
	}
	return nil
}

// runOutage takes the upstream link down at UpstreamOutageAt and up
// again UpstreamOutageFor later (at once if ctx ends meanwhile), and
// records when.
func (f *fleet) runOutage(ctx context.Context, rep *Report) {
	if !sleepUntil(ctx, rep.Started.Add(f.cfg.UpstreamOutageAt)) {
		return
	}
	f.cfg.UpstreamOutage(true)
	ev := OutageEvent{At: time.Now()}
	sleepUntil(ctx, ev.At.Add(f.cfg.UpstreamOutageFor))
	f.cfg.UpstreamOutage(false)
	ev.Took = time.Since(ev.At)
	rep.Outages = append(rep.Outages, ev)
}

// OutageEvent is one outage of the upstream link during a run.
type OutageEvent struct {
	At   time.Time     `json:"at"`
	Took time.Duration `json:"took_ns"`
}

// RestartEvent is one gateway restart during a run.
type RestartEvent struct {
	Mode string    `json:"mode"`
	At   time.Time `json:"at"`
	// Took is from the start of Restart to the subscriber being back.
	Took time.Duration `json:"took_ns"`
	Err  string        `json:"error,omitempty"`
}

// gate holds devices back while the gateway restarts. gen counts
// restarts begun, so that a device can tell a connection lost to a
// restart from one lost to anything else. Safe for concurrent use.
type gate struct {
	mu   sync.Mutex
	shut chan struct{} // nil when open
	gen  int
}

// close makes wait block until open.
func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.shut = make(chan struct{})
	g.gen++
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut != nil {
		close(g.shut)
		g.shut = nil
	}
}

// wait returns once the gate is open, or false when ctx ends first.
func (g *gate) wait(ctx context.Context) bool {
	g.mu.Lock()
	ch := g.shut
	g.mu.Unlock()
	if ch == nil {
		return ctx.Err() == nil
	}
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// generation returns how many restarts have begun.
func (g *gate) generation() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.gen
}

// restart runs cfg.Restart with the devices held back and the
// subscriber's loss expected, then brings a new subscriber up and lets
// the devices reconnect.
func (f *fleet) restart(ctx context.Context) RestartEvent {
	ev := RestartEvent{Mode: f.cfg.RestartMode, At: time.Now()}
	f.gate.close()
	defer f.gate.open()
	f.rec.setRestarting(true)
	err := f.cfg.Restart(ctx)
	f.sub.close() // its connection is gone or going
	if err == nil {
		var sub *subscriber
		// The run may end while the gateway restarts; the drain still
		// needs a subscriber.
		if sub, err = subscribe(context.WithoutCancel(ctx), f.cfg, f.rec); err == nil {
			f.sub = sub // only this goroutine and Run after it touch f.sub
		}
	}
	f.rec.setRestarting(err != nil) // a failed restart leaves no subscriber to lose
	ev.Took = time.Since(ev.At)
	if err != nil {
		ev.Err = err.Error()
		f.rec.mu.Lock()
		f.rec.subLost = true
		f.rec.note(fmt.Errorf("restart: %w", err))
		f.rec.mu.Unlock()
	}
	return ev
}

// allowances sets each log's Allowance: the distinct messages that
// reached the subscriber in the crash-loss period before each restart.
func allowances(logs []DeviceLog, restarts []RestartEvent, loss time.Duration) {
	if loss <= 0 {
		return
	}
	for i := range logs {
		for _, ev := range restarts {
			from := ev.At.Add(-loss)
			seen := make(map[uint64]bool)
			for _, a := range logs[i].Arrivals {
				if a.At.After(from) && !a.At.After(ev.At) {
					seen[a.Seq] = true
				}
			}
			logs[i].Allowance += len(seen)
		}
	}
}
