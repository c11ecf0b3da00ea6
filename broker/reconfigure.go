package broker

// Reconfigure puts the resolver's rules in force for the connected
// devices after a configuration reload (call it after
// devicelimit.Resolver.Reconfigure): each connection's rule quota,
// topic classes and group are looked up again, so that its device's
// next message is judged by them, without a reconnection. The groups
// listed by Groups are those joined since. It returns the connections
// updated. A connection being established while it runs may keep the
// rules it looked up a moment before, until it reconnects.
func (s *Server) Reconfigure() int {
	h := s.hook
	h.groupsSeen.Clear()
	h.devMu.Lock()
	var live []*connInfo
	for _, d := range h.devices {
		live = append(live, d.live...)
	}
	h.devMu.Unlock()
	for _, c := range live {
		c.rv.Store(h.ruleView(c.clientID, c.username))
	}
	return len(live)
}
