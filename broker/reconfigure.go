package broker

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/devicegate/devicegate/auth"
)

// Reconfigure puts the resolver's rules in force for the connected
// devices after a configuration reload (call it after
// devicelimit.Resolver.Reconfigure): each connection's rule quota,
// topic classes and group are looked up again, so that its device's
// next message is judged by them, without a reconnection. The groups
// listed by Groups are those joined since. It returns the connections
// updated. A connection being established while it runs is judged by
// the new rules too: it looks them up again when they changed after
// its first lookup (throttle.OnSessionEstablish).
func (s *Server) Reconfigure() int {
	h := s.hook
	// The groups listed from now on are those of lookups begun since
	// the resolver took the new rules (it did before this call).
	h.groupsSince.Store(h.resolver.Generation())
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

// SetACL puts acl in force for every check from now on: a connected
// device's next publish outside it is refused (AuthStats.PublishDenied,
// as at any time), a subscription it made before that acl no longer
// allows stays but delivers nothing more (mochi asks the ACL at each
// delivery), and new subscriptions are checked against it; nobody is
// disconnected. A will accepted at CONNECT stays. In allow-all mode the
// ACL is not consulted. It is an error for a zero ACL while
// authentication is on.
func (s *Server) SetACL(acl auth.ACL) error {
	if acl.IsZero() && !s.opts.Auth.AllowAll() {
		return fmt.Errorf("%w: SetACL: authentication is on and needs an ACL (auth.NewACL)", ErrInvalidOptions)
	}
	s.auth.acl.Store(&acl)
	return nil
}

// reloadableLimits are the fields of Limits that SetLimits changes.
var reloadableLimits = []string{"ConnectRate", "ConnectRateExempt", "MaxPendingConnections", "MaxPendingPerAddress", "Consumers", "ConsumerWriteBuffer"}

// SetLimits puts in force the limits a running server can change: the
// per-address connection rate and its exemptions (ConnectRate,
// ConnectRateExempt) for the connections accepted after, each address's
// count so far kept; the bounds of the connections that have not sent
// CONNECT (MaxPendingConnections, MaxPendingPerAddress) for the next
// one accepted (beyond a lowered bound, each newcomer closes one
// oldest); the backend consumers (Consumers, ConsumerWriteBuffer) for
// the clients that connect after: a connected client stays what it was
// at its CONNECT. Every other field must be as New had it: they need a
// new server. An error names them, or what New would refuse, and
// changes nothing.
func (s *Server) SetLimits(l Limits) error {
	if err := l.validate(); err != nil {
		return err
	}
	was, now := reflect.ValueOf(s.opts.Limits), reflect.ValueOf(l)
	var fixed []string
	for i := range was.NumField() {
		name := was.Type().Field(i).Name
		if !slices.Contains(reloadableLimits, name) && !reflect.DeepEqual(was.Field(i).Interface(), now.Field(i).Interface()) {
			fixed = append(fixed, name)
		}
	}
	if fixed != nil {
		return fmt.Errorf("%w: SetLimits: %s cannot change in a running server", ErrInvalidOptions, strings.Join(fixed, ", "))
	}
	h := s.auth
	h.connect.Store(&connectRate{quota: l.ConnectRate, exempt: slices.Clone(l.ConnectRateExempt)})
	h.pending.setBounds(l.MaxPendingConnections, l.MaxPendingPerAddress)
	h.consumers.setRules(l)
	return nil
}
