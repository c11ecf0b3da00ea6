package server

import (
	"log/slog"
	"os"
	"strings"

	"devicegate/admin"
	"devicegate/broker"
	"devicegate/config"
	"devicegate/forward"
	"devicegate/persist"
)

// newForward builds a forwarder per forward: upstream, each over its
// forward log in the data file (Start runs them); nil without any.
func newForward(cfg config.Config, store *persist.Store, log *slog.Logger, deliver func(topic string, payload []byte, retain bool, qos byte) error) (*forward.Set, error) {
	if len(cfg.Forward) == 0 {
		return nil, nil
	}
	host, _ := os.Hostname()
	host = strings.NewReplacer("/", "-", "+", "-", "#", "-").Replace(host)
	routes := make([]forward.Route, 0, len(cfg.Forward))
	for _, fc := range cfg.Forward {
		id := fc.ClientID
		if id == "" {
			id = "devicegate-" + host + "-" + fc.Name
		}
		f, err := forward.New(forward.Config{
			Name: fc.Name + "/0", Upstream: fc.Name, Addr: fc.Addr(), ClientID: id, Username: fc.Username, Password: fc.Password,
			LocalPrefix: fc.LocalPrefix, RemotePrefix: fc.RemotePrefix, MaxQoS: byte(fc.MaxQoS),
			Subscribe: fc.Subscribe, Deliver: deliver, MaxBytes: int64(fc.MaxBytes), Overflow: overflow(fc.Overflow),
		}, store, log)
		if err != nil {
			return nil, err
		}
		routes = append(routes, forward.Route{Filters: fc.Topics, F: f})
		log.Info("forwarding upstream", "name", fc.Name, "to", fc.To, "topics", strings.Join(fc.Topics, ","), "client_id", id)
	}
	return forward.NewSet(routes), nil
}

// forwarder is the broker's Forwarder: the set, or nil without one (a
// nil *forward.Set in the interface would not be nil).
func (g *Gateway) forwarder() broker.Forwarder {
	if g.forward == nil {
		return nil
	}
	return g.forward
}

// forwardStats converts the forwarders' states for the metrics.
func forwardStats(s *forward.Set) []admin.ForwardStats {
	if s == nil {
		return nil
	}
	var out []admin.ForwardStats
	for _, st := range s.Stats() {
		out = append(out, admin.ForwardStats{Upstream: st.Name, Connected: st.Connected, Forwarded: st.Forwarded,
			Backlog: st.Backlog, BacklogBytes: st.BacklogBytes, DroppedOldest: st.DroppedOldest, Refused: st.Refused})
	}
	return out
}

// overflow is the forward package's overflow policy of a configuration
// name (validated): drop_oldest when empty.
func overflow(name string) forward.Overflow {
	if name == "refuse_new" {
		return forward.RefuseNew
	}
	return forward.DropOldest
}
