package broker

import (
	"sort"
	"sync/atomic"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// Group outcomes: the indexes of Stats.Groups' counts.
const (
	// GroupAdmitted counts the messages of a group's devices its
	// windows admitted (and counted).
	GroupAdmitted = iota
	// GroupRefused counts those its windows refused.
	GroupRefused
	// GroupWouldRefuse counts those its windows, in shadow mode, would
	// have refused and let through.
	GroupWouldRefuse
)

// groupStats counts one configured group's outcomes; the groups of a
// template share one (its label).
type groupStats [3]atomic.Uint64

// newGroupStats returns the counters of every configured group, by
// label: a map fixed at start, so its size is bounded by the
// configuration however many groups the templates make.
func newGroupStats(r *devicelimit.Resolver) map[string]*groupStats {
	m := map[string]*groupStats{}
	if r == nil {
		return m
	}
	for _, label := range r.GroupLabels() {
		m[label] = new(groupStats)
	}
	return m
}

// groupOf is a connection's group: its membership, and the counters of
// its label.
type groupOf struct {
	devicelimit.Membership
	stats *groupStats
}

// groupClashLogEvery spaces the warnings about one group made with two
// quotas.
const groupClashLogEvery = time.Hour

// seenGroup is a group a device joined, and the rules' generation
// (devicelimit.Resolver.Generation) read before the lookup that found it.
type seenGroup struct {
	devicelimit.Membership
	gen uint64
}

// joinGroup returns a connection's group of membership m (none when m
// names none), found by a lookup that began at the rules' generation
// gen, remembering the group. A lookup that began before a reload and
// ends after it (a device connecting meanwhile) may find a group the
// reload removed: it is remembered under its old generation, older
// than the reload's (groupsSince), which Groups leaves out and the
// cluster's registry is not told of; the connection looks its rules up
// again (throttle.OnSessionEstablish). Overrides and enforce switches
// move the generation too: a join under a newer one replaces the entry.
func (h *throttle) joinGroup(m devicelimit.Membership, gen uint64) groupOf {
	if m.Name == "" {
		return groupOf{}
	}
	// Load first: storing allocates, and a known group is the rule.
	v, seen := h.groupsSeen.Load(m.Name)
	for !seen || v.(*seenGroup).gen < gen {
		g := &seenGroup{Membership: m, gen: gen}
		var stored bool
		if !seen {
			v, seen = h.groupsSeen.LoadOrStore(m.Name, g)
			stored = !seen
		} else if stored = h.groupsSeen.CompareAndSwap(m.Name, v, g); !stored {
			v, seen = h.groupsSeen.Load(m.Name)
		}
		if stored {
			// Told to the registry when Groups lists it: not a lookup
			// begun before the last reload.
			if h.groupJoined != nil && gen >= h.groupsSince.Load() {
				h.groupJoined(m)
			}
			v = g
			break
		}
	}
	if first := v.(*seenGroup).Membership; first.Quota != m.Quota && h.logs.allow(logGroup, m.Name, groupClashLogEvery) {
		// Two rules' templates made one group with different quotas:
		// each message is judged by its own device's rule's.
		h.log.Warn("group made by two rules with different quotas; each message is judged by its device's rule's: give one group one quota",
			"group", m.Name, "first", first.Quota.Describe(), "now", m.Quota.Describe())
	}
	return groupOf{Membership: m, stats: h.groups[m.Label]}
}

// decideGroup decides a publish of a device in a group (see
// devicelimit.Table.AllowGroupAt) and counts the group's outcome. It
// returns the decision, the group's quota at now, whether the group's
// window refused, and whether a refusal is one to let through (its part
// in shadow mode).
func (h *throttle) decideGroup(c *connInfo, class string, q devicelimit.Quota, size int, now devicelimit.Tick) (devicelimit.Decision, devicelimit.Quota, bool, bool) {
	g := c.rules().group
	gq := h.resolver.GroupQuotaAt(g.Membership, now)
	d := h.limiter.AllowGroupAt(c.device, class, q, g.Key, gq, size, now)
	outcome := -1
	switch {
	case d.Allowed || !d.Group && q.Shadow && !gq.Shadow:
		// Admitted by the group's windows, and counted there; in the
		// second case the device's own windows, in shadow mode and
		// decided after the group's, would refuse it.
		outcome = GroupAdmitted
	case d.Group && gq.Shadow:
		outcome = GroupWouldRefuse
	case d.Group:
		outcome = GroupRefused
	}
	if st := g.stats; st != nil && outcome >= 0 {
		st[outcome].Add(1)
	}
	return d.Decision, gq, d.Group && !d.Allowed, letThrough(d, &q, &gq)
}

// GroupMembers is a group a device joined since start: its name,
// metric label and rule's quota, and how many of its devices are
// connected now.
type GroupMembers struct {
	Name      string
	Label     string
	Quota     devicelimit.Quota
	Connected int
}

// Groups returns the groups devices joined under the rules in force
// (since start or the last reload: lookups begun before it are left
// out), by name, with their devices connected now. (The gateway keeps one entry per group
// it has seen: groups are few, a tenant's devices many.)
func (s *Server) Groups() []GroupMembers {
	h := s.hook
	by := map[string]*GroupMembers{}
	since := h.groupsSince.Load()
	h.groupsSeen.Range(func(k, v any) bool {
		if g := v.(*seenGroup); g.gen >= since {
			by[g.Name] = &GroupMembers{Name: g.Name, Label: g.Label, Quota: g.Quota}
		}
		return true
	})
	h.devMu.Lock()
	for _, d := range h.devices {
		if len(d.live) == 0 {
			continue
		}
		if g := d.live[len(d.live)-1].rules().group; g.Key != "" {
			if m := by[g.Name]; m != nil {
				m.Connected++
			}
		}
	}
	h.devMu.Unlock()
	out := make([]GroupMembers, 0, len(by))
	for _, m := range by {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
