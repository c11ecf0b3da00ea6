package forward

import (
	"context"
	"strings"
	"sync"
)

// Route sends the messages whose topic matches one of Filters to F.
type Route struct {
	Filters []string
	F       *Forwarder
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

// Forward appends the message to every upstream whose filters match
// topic, durably, and returns once all hold it; an error means at least
// one does not (the device is then not acknowledged, and sends again).
func (s *Set) Forward(topic string, qos byte, retain bool, payload []byte) error {
	for _, r := range s.routes {
		if matchAny(r.Filters, topic) {
			if err := r.F.Append(topic, qos, retain, payload); err != nil {
				return err
			}
		}
	}
	return nil
}

// Start runs every forwarder until Stop.
func (s *Set) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	for _, r := range s.routes {
		s.wg.Go(func() { r.F.Run(ctx) })
	}
}

// Stop ends the forwarders and waits for them; what they had not sent
// stays in the forward logs for the next start.
func (s *Set) Stop() {
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
}

// Stats returns every forwarder's state, in configuration order.
func (s *Set) Stats() []Stats {
	out := make([]Stats, len(s.routes))
	for i, r := range s.routes {
		out[i] = r.F.Stats()
	}
	return out
}

// Routes returns the routes.
func (s *Set) Routes() []Route { return s.routes }

func matchAny(filters []string, topic string) bool {
	for _, f := range filters {
		if Match(f, topic) {
			return true
		}
	}
	return false
}

// Match reports whether topic matches the MQTT topic filter: '+' one
// whole level, '#' the rest (the parent level included); a topic
// starting with '$' matches no filter starting with a wildcard.
func Match(filter, topic string) bool {
	if strings.HasPrefix(topic, "$") && (strings.HasPrefix(filter, "+") || strings.HasPrefix(filter, "#")) {
		return false
	}
	for {
		f, frest, fmore := strings.Cut(filter, "/")
		if f == "#" {
			return true
		}
		t, trest, tmore := strings.Cut(topic, "/")
		if f != "+" && f != t {
			return false
		}
		if !fmore || !tmore {
			if !fmore && !tmore {
				return true
			}
			return fmore && frest == "#" // "a/#" matches "a"
		}
		filter, topic = frest, trest
	}
}
