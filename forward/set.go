package forward

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/devicegate/devicegate/devicelimit"
)

// Route sends the messages whose topic matches one of Filters to one of
// Conns, chosen by the device: a device always goes through the same
// connection, so its order holds. Drain are connections left from a
// larger count: they send what their logs hold and take nothing new.
type Route struct {
	Filters []string
	Conns   []*Forwarder
	Drain   []*Forwarder
}

// Set is every upstream of a gateway: the broker hands it each admitted
// message (and each released deferred one).
type Set struct {
	routes []Route
	wg     sync.WaitGroup
	cancel context.CancelFunc
}

// NewSet returns the set of routes; Start runs their forwarders.
func NewSet(routes []Route) *Set { return &Set{routes: routes} }

// Forward appends m to every upstream whose filters match its topic,
// durably, and returns once all hold it; an error means at least one
// does not (the device is then not acknowledged, and sends again).
func (s *Set) Forward(m *Message) error {
	q, err := s.ForwardAsync(m)
	if err != nil {
		return err
	}
	return q.Wait()
}

// ForwardAsync is Forward without the wait: it queues m in every
// matching upstream's log and returns the Queued whose Wait returns once
// all hold it durably (None when no upstream takes m's topic).
func (s *Set) ForwardAsync(m *Message) (Queued, error) {
	var all Queued
	for _, r := range s.routes {
		if len(r.Conns) > 0 && matchAny(r.Filters, m.Topic) {
			f := r.Conns[0]
			if len(r.Conns) > 1 {
				f = r.Conns[connOf(m.Device, len(r.Conns))]
			}
			q, err := f.AppendAsync(m)
			if err != nil {
				_ = all.Wait() // queued already: let them finish
				return Queued{}, err
			}
			if all.None() {
				all = q
			} else {
				all.more = append(all.more, q)
			}
		}
	}
	return all, nil
}

// connOf is the connection, of n, of a device: FNV-1a of its ID, the
// same in every process and after every restart, so that a device's
// messages written before a restart and after it go through one
// connection's log, in order (a per-process random seed would move it).
func connOf(device string, n int) int {
	h := uint64(14695981039346656037)
	for i := 0; i < len(device); i++ {
		h ^= uint64(device[i])
		h *= 1099511628211
	}
	return int(h % uint64(n))
}

// Start runs every forwarder until Stop.
func (s *Set) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	for _, r := range s.routes {
		for _, f := range r.all() {
			s.wg.Go(func() { f.Run(ctx) })
		}
	}
}

func (r Route) all() []*Forwarder { return append(r.Conns[:len(r.Conns):len(r.Conns)], r.Drain...) }

// Stop ends the forwarders and waits for them until ctx ends; what they
// had not sent stays in the forward logs for the next start. A
// forwarder ends within its destination's write deadline and
// closeTimeout of the cancellation; one that does not by ctx's end is
// left to end on its own (the error says so): a shutdown never waits
// on a destination.
func (s *Set) Stop(ctx context.Context) error {
	if s.cancel != nil {
		s.cancel()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("forwarders not stopped: %w", ctx.Err())
	}
}

// Stats returns every upstream's state (its connections' summed; the
// oldest age the greatest), in configuration order.
func (s *Set) Stats() []Stats {
	out := make([]Stats, len(s.routes))
	for i, r := range s.routes {
		for j, f := range r.all() {
			st := f.Stats()
			if j >= len(r.Conns) {
				st.Connections = 0 // a draining connection is not one of the configured
			}
			out[i] = out[i].add(st)
		}
	}
	return out
}

// add sums two states of one upstream.
func (a Stats) add(b Stats) Stats {
	a.Upstream = b.Upstream
	a.Connections += b.Connections
	a.Connected += b.Connected
	if a.LastError == "" {
		a.LastError = b.LastError
	}
	if a.RetryIn == 0 || b.RetryIn != 0 && b.RetryIn < a.RetryIn {
		a.RetryIn = b.RetryIn
	}
	a.Forwarded += b.Forwarded
	a.Backlog += b.Backlog
	a.BacklogBytes += b.BacklogBytes
	a.OldestAge = max(a.OldestAge, b.OldestAge)
	a.DroppedOldest += b.DroppedOldest
	a.Refused += b.Refused
	a.LowSpace += b.LowSpace
	a.Expired += b.Expired
	a.DeadLetters += b.DeadLetters
	a.DeadDropped += b.DeadDropped
	a.Reordered += b.Reordered
	for r, n := range b.DeadByReason {
		if a.DeadByReason == nil {
			a.DeadByReason = map[string]uint64{}
		}
		a.DeadByReason[r] += n
	}
	return a
}

// Upstream returns the forwarders of the upstream named name (its
// connections, then those draining), or nil when none is.
func (s *Set) Upstream(name string) []*Forwarder {
	for _, r := range s.routes {
		if all := r.all(); len(all) > 0 && all[0].cfg.Upstream == name {
			return all
		}
	}
	return nil
}

// Routes returns the routes.
func (s *Set) Routes() []Route { return s.routes }

func matchAny(filters []string, topic string) bool {
	for _, f := range filters {
		if devicelimit.MatchTopic(f, topic) {
			return true
		}
	}
	return false
}

// LogUpstream returns the upstream (the forward: entry's name) of
// forward log log ("NAME/N").
func LogUpstream(log string) string {
	if i := strings.LastIndexByte(log, '/'); i >= 0 {
		return log[:i]
	}
	return log
}
