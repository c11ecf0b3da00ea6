package fleet

import (
	"context"
	"fmt"
	"io"
	"time"
)

// Steady is what a phase measured at steady state: from a window of T
// after every device was connected (the connect storm's claims and first
// checkpoints done) until the gateway kill, or the phase's end. Messages
// are counted by the gateways' own devicegate_publishes_total.
type Steady struct {
	// From and To are the offsets into the phase; To is 0 when the
	// devices were never all connected long enough before the end.
	From, To time.Duration
	// Admitted and Decided are the cluster gateways' admitted publishes
	// and all their decisions over the interval.
	Admitted, Decided float64
	Redis             RedisStats
	GatewayCPU        time.Duration
	// StandaloneCPU and StandaloneDecided are the side-by-side
	// standalone gateway's over the same interval.
	StandaloneCPU     time.Duration
	StandaloneDecided float64
}

// steadyPoint is one reading of the counters Steady compares.
type steadyPoint struct {
	at                time.Time
	admitted, decided float64
	redis             RedisStats
	cpu, aloneCPU     time.Duration
	aloneDecided      float64
	connected         float64
}

// read takes a steadyPoint over gws, alone (nil for none) and redis.
func readSteady(ctx context.Context, gws, alone *Gateways, redis *Redis) steadyPoint {
	p := steadyPoint{at: time.Now(), redis: redis.Stats(ctx)}
	for i, s := range gws.Stats() {
		if !gws.Alive(i) {
			continue
		}
		a := gws.list[i].admin.Addr
		p.cpu += s.CPU
		p.admitted += metricSum(ctx, a, `devicegate_publishes_total{decision="allowed"}`)
		p.decided += metricSum(ctx, a, "devicegate_publishes_total")
		p.connected += metricSum(ctx, a, "devicegate_connected_clients")
	}
	if alone != nil {
		p.aloneCPU = alone.Stats()[0].CPU
		p.aloneDecided = metricSum(ctx, alone.list[0].admin.Addr, "devicegate_publishes_total")
	}
	return p
}

// watchSteady measures Steady from start until end: it polls until the
// gateways hold at least devices connections, waits settle (a window of
// T), reads the counters, and reads them again after as many whole
// periods (of the devices' messages) as fit before end. The result comes
// on the channel once end has passed (or stop was closed).
func watchSteady(ctx context.Context, logf func(string, ...any), start, end time.Time, devices int, settle, period time.Duration, gws, alone *Gateways, redis *Redis, stop <-chan struct{}) <-chan Steady {
	out := make(chan Steady, 1)
	go func() {
		var s Steady
		defer func() { out <- s }()
		wait := func(d time.Duration) bool {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
				return true
			case <-stop:
				return false
			}
		}
		for {
			if time.Now().After(end) {
				return
			}
			if p := readSteady(ctx, gws, alone, redis); p.connected >= float64(devices) {
				break
			}
			if !wait(500 * time.Millisecond) {
				return
			}
		}
		if !wait(settle) || !time.Now().Add(settle).Before(end) {
			return
		}
		p0 := readSteady(ctx, gws, alone, redis)
		logf("steady state from %s: %.0f connections, %.0f admitted and %.0f decided so far, %s gateway CPU",
			p0.at.Sub(start).Round(time.Millisecond), p0.connected, p0.admitted, p0.decided, p0.cpu)
		// Whole periods of the devices' rate: devices that connected
		// together publish together, so a part of a period counts a part
		// of them.
		length := time.Until(end)
		if n := length / period; n >= 1 {
			length = n * period
		}
		if !wait(length) {
			return
		}
		p1 := readSteady(ctx, gws, alone, redis)
		logf("steady state to %s: %.0f connections, %.0f admitted and %.0f decided so far, %s gateway CPU",
			p1.at.Sub(start).Round(time.Millisecond), p1.connected, p1.admitted, p1.decided, p1.cpu)
		s = Steady{From: p0.at.Sub(start), To: p1.at.Sub(start), Admitted: p1.admitted - p0.admitted, Decided: p1.decided - p0.decided,
			Redis: p1.redis.Sub(p0.redis), GatewayCPU: p1.cpu - p0.cpu, StandaloneCPU: p1.aloneCPU - p0.aloneCPU,
			StandaloneDecided: p1.aloneDecided - p0.aloneDecided}
	}()
	return out
}

// CommandsPerAdmitted is Redis's commands per admitted message at
// steady state; 0 without one.
func (s Steady) CommandsPerAdmitted() float64 {
	if s.Admitted <= 0 {
		return 0
	}
	return float64(s.Redis.Commands) / s.Admitted
}

// CPUPerMessage is the cluster gateways' and the standalone gateway's
// CPU per decided message at steady state (0 without one).
func (s Steady) CPUPerMessage() (cluster, standalone time.Duration) {
	if s.Decided > 0 {
		cluster = time.Duration(float64(s.GatewayCPU) / s.Decided)
	}
	if s.StandaloneDecided > 0 {
		standalone = time.Duration(float64(s.StandaloneCPU) / s.StandaloneDecided)
	}
	return cluster, standalone
}

// write prints the steady-state line of a phase.
func (s Steady) write(w io.Writer) {
	if s.To == 0 {
		fmt.Fprintf(w, "  steady state: none (the devices were never all connected a window before the kill or the end)\n")
		return
	}
	cl, al := s.CPUPerMessage()
	fmt.Fprintf(w, "  steady state %s..%s into the phase: %.0f admitted of %.0f decided; Redis %d commands, %.4f per admitted message (%v); gateway CPU per message %s",
		s.From.Round(time.Second), s.To.Round(time.Second), s.Admitted, s.Decided, s.Redis.Commands, s.CommandsPerAdmitted(), s.Redis.Top(4), cl.Round(100*time.Nanosecond))
	if al > 0 {
		fmt.Fprintf(w, ", standalone %s: %.2fx", al.Round(100*time.Nanosecond), float64(cl)/float64(al))
	}
	fmt.Fprintln(w)
}

// watchPhase watches a phase of devices starting now for its steady
// state, until its kill (or its end when there is none); the function
// returned, called once the phase ended, returns it.
func watchPhase(ctx context.Context, spec Spec, devices int, rate float64, kill, duration time.Duration, gws, alone *Gateways, redis *Redis) func() Steady {
	start := time.Now()
	end := start.Add(duration)
	if kill > 0 {
		end = start.Add(kill - time.Second) // the killed gateway's counters still count
	}
	logf := spec.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	stop := make(chan struct{})
	ch := watchSteady(ctx, logf, start, end, devices, spec.Quota.Window, time.Duration(float64(time.Second)/max(rate, 1e-3)), gws, alone, redis, stop)
	return func() Steady {
		close(stop)
		return <-ch
	}
}
