package devicelimit

// The resolver's groups: which group a device's rule puts it in
// (templates of its client ID and username parts), and the group's
// quota in force. The group windows themselves are in group.go.

import (
	"fmt"
	"slices"
)

// groupOf is a compiled rule's (or the default's) group: its template
// and the parts it fills in.
type groupOf struct {
	on    bool
	tmpl  Template
	quota Quota
}

// compileGroup compiles g's template against the parts the rule's
// patterns name, and checks its quota.
func compileGroup(g *Group, clientID, username Glob, buckets int) (groupOf, error) {
	if g == nil {
		return groupOf{}, nil
	}
	parts := []string{PartClientID, PartUsername}
	for _, n := range append(slices.Clone(clientID.Names()), username.Names()...) {
		if slices.Contains(parts, n) {
			return groupOf{}, fmt.Errorf("%w: the part {%s} is named twice (the client_id and username patterns, or a name of its own)", ErrInvalidPattern, n)
		}
		parts = append(parts, n)
	}
	t, err := CompileTemplate(g.Name, parts)
	if err != nil {
		return groupOf{}, &FieldError{Field: "group.name", Msg: err.Error(), Err: ErrInvalidPattern}
	}
	if err := ValidateGroupQuota(g.Quota, buckets); err != nil {
		if fe, ok := err.(*FieldError); ok {
			return groupOf{}, &FieldError{Field: "group.quota." + fe.Field, Msg: fe.Msg, Err: fe.Err}
		}
		return groupOf{}, err
	}
	return groupOf{on: true, tmpl: t, quota: g.Quota}, nil
}

// member returns the group of a device with this client ID and username
// under rule r's group (patterns cid and user fill its named parts).
func (g *groupOf) member(cid, user Glob, clientID, username string) Membership {
	if !g.on {
		return Membership{}
	}
	values := []string{clientID, username}
	if names := cid.Names(); len(names) > 0 {
		caps, _ := cid.Capture(clientID)
		values = append(values, caps...)
	}
	if names := user.Names(); len(names) > 0 {
		caps, _ := user.Capture(username)
		values = append(values, caps...)
	}
	name := g.tmpl.Expand(values)
	return Membership{Name: name, Key: GroupKey(name), Quota: g.quota, Label: g.tmpl.String()}
}

// Membership is the group a device is in by its rule (or the default):
// its name and key (GroupKey, made once, for decisions that must not
// allocate), the quota its rule gives the group, and the label its
// metrics count under (the template: a bounded set, however many groups
// a template makes). The zero value is no group.
type Membership struct {
	Name  string
	Key   string
	Quota Quota
	Label string
}

// SetDefaultGroup puts the devices of the default quota in a group,
// whose template may name {client_id} and {username}. Call it before
// the resolver is shared.
func (r *Resolver) SetDefaultGroup(g *Group) error {
	s := r.set.Load()
	gr, err := compileGroup(g, Glob{}, Glob{}, r.buckets)
	if err != nil {
		return fmt.Errorf("default: %w", err)
	}
	s.defGroup = gr
	return nil
}

// GroupOf returns the group of a device with this client ID and
// username: its rule's (the first matching, as RuleClasses), or the
// default's. It allocates: call it once per connection.
func (r *Resolver) GroupOf(clientID, username string) Membership {
	s := r.set.Load()
	return s.groupOf(s.ruleFor(clientID, username), clientID, username)
}

// groupOf is GroupOf under rule i (-1: the default).
func (s *ruleSet) groupOf(i int, clientID, username string) Membership {
	if i < 0 {
		return s.defGroup.member(Glob{}, Glob{}, clientID, username)
	}
	cr := &s.rules[i]
	return cr.group.member(cr.clientID, cr.username, clientID, username)
}

// GroupQuotaAt returns the quota of the group m names at now: the
// group's override, when it has one, else m's.
func (r *Resolver) GroupQuotaAt(m Membership, now Tick) Quota {
	if o, ok := r.Override(m.Key, now); ok {
		return o.Quota
	}
	return m.Quota
}

// GroupLabels returns the labels of the configured groups (their
// templates), each once, in order: the bound of the metrics' group
// label.
func (r *Resolver) GroupLabels() []string {
	s := r.set.Load()
	var out []string
	add := func(g groupOf) {
		if g.on && !slices.Contains(out, g.tmpl.String()) {
			out = append(out, g.tmpl.String())
		}
	}
	add(s.defGroup)
	for i := range s.rules {
		add(s.rules[i].group)
	}
	return out
}

// GroupConfigured returns the quota and label of the group named name
// when a fixed template of the configuration names it.
func (r *Resolver) GroupConfigured(name string) (Membership, bool) {
	s := r.set.Load()
	check := func(g groupOf) (Membership, bool) {
		if g.on && g.tmpl.Fixed() && g.tmpl.String() == name {
			return Membership{Name: name, Key: GroupKey(name), Quota: g.quota, Label: name}, true
		}
		return Membership{}, false
	}
	for i := range s.rules {
		if m, ok := check(s.rules[i].group); ok {
			return m, true
		}
	}
	return check(s.defGroup)
}

// GroupPossible reports whether a configured group template (a rule's
// or the default's) can make a group named name: an override for a
// group no template can make would never apply.
func (r *Resolver) GroupPossible(name string) bool {
	s := r.set.Load()
	if s.defGroup.on && s.defGroup.tmpl.CouldMake(name) {
		return true
	}
	for i := range s.rules {
		if g := s.rules[i].group; g.on && g.tmpl.CouldMake(name) {
			return true
		}
	}
	return false
}
