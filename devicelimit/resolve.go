package devicelimit

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
)

// Rule gives a quota to the devices whose client ID and username match
// its globs. A rule with both globs needs both to match; one without any
// is an error.
type Rule struct {
	Name     string
	ClientID string // glob over the MQTT client ID, "" for any
	Username string // glob over the MQTT username, "" for any
	Quota    Quota
	// Classes are the rule's topic classes (class.go): a message on a
	// topic of one is counted under the class's quota instead.
	Classes []Class
	// Group, when not nil, puts the rule's devices in a group (group.go).
	Group *Group
}

type compiledRule struct {
	Rule
	clientID, username Glob
	hasClientID        bool
	hasUsername        bool
	group              groupOf
}

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

func (r *compiledRule) match(clientID, username string) bool {
	return (!r.hasClientID || r.clientID.Match(clientID)) && (!r.hasUsername || r.username.Match(username))
}

// SourceKind says where a device's quota came from.
type SourceKind uint8

// The quota sources, in order of precedence.
const (
	SourceDefault SourceKind = iota
	SourceRule
	SourceOverride
)

// Source names where a quota came from: the default, a rule (by name), or
// a runtime override.
type Source struct {
	Kind SourceKind
	Rule string // the rule's name, for SourceRule
}

// String formats the source as "default", "override" or "rule:NAME".
func (s Source) String() string {
	switch s.Kind {
	case SourceOverride:
		return "override"
	case SourceRule:
		return "rule:" + s.Rule
	default:
		return "default"
	}
}

// Override is a runtime quota for one device, in force until ExpiresAt
// (never when zero). Classes, when there are any, are the device's
// topic classes instead of its rule's (or the default's); an override
// without classes keeps those.
type Override struct {
	Quota     Quota
	ExpiresAt Tick
	Classes   []Class
}

// Validate reports whether o can be set for device on a table of the
// given bucket count: a valid device ID, a valid quota, and an expiry not
// before 1970 (0: none). It is the one check of an override, made by the
// resolver, the store, the Redis overrides and the admin API alike; the
// error is a *FieldError naming the field.
func (o Override) Validate(device string, buckets int) error {
	if err := ValidOverrideKey(device); err != nil {
		return err
	}
	if err := o.Quota.Validate(buckets); err != nil {
		return err
	}
	if err := ValidateClasses(o.Classes, buckets); err != nil {
		return err
	}
	if o.ExpiresAt < 0 {
		return &FieldError{Field: "expires_at", Msg: fmt.Sprintf("must not be before 1970 (got %d ns)", int64(o.ExpiresAt)), Err: ErrInvalidQuota}
	}
	return nil
}

// Expired reports whether the override has lapsed at now.
func (o Override) Expired(now Tick) bool { return o.ExpiresAt != 0 && now >= o.ExpiresAt }

const overrideShards = 64

// Resolver decides which quota applies to a device: a runtime override
// for its ID, else the first config rule matching its client ID and
// username, else the default. Rules are fixed at construction; overrides
// change at runtime and apply from the device's next message. Safe for
// concurrent use.
type Resolver struct {
	def      Quota
	classes  []Class // the default's topic classes
	defGroup groupOf // the default's group
	rules    []compiledRule
	buckets  int

	count  atomic.Int64 // number of overrides, so the common no-override case takes no lock
	shards [overrideShards]overrideShard

	// modes are the rules' runtime enforce switches (SetRuleEnforce),
	// by rule index: modeConfigured, modeEnforce or modeShadow.
	// switched is set once any was switched, so the common case reads
	// one atomic.
	modes    []atomic.Int32
	ruleIdx  map[string]int
	switched atomic.Bool

	// blocking is set once any quota, configured or an override's, has
	// a block: until then no device can be blocked (MayBlock).
	blocking atomic.Bool
}

// blocks reports whether q or one of cs has a block.
func blocks(q Quota, cs []Class) bool {
	if q.Block != (Block{}) {
		return true
	}
	for _, c := range cs {
		if c.Quota.Block != (Block{}) {
			return true
		}
	}
	return false
}

// MayBlock reports whether some quota, configured or set as an override
// since start, has a block: when none has, no device can be blocked,
// and a CONNECT need not ask whether it is.
func (r *Resolver) MayBlock() bool { return r.blocking.Load() }

// The runtime enforce switch of a rule.
const (
	modeConfigured int32 = iota
	modeEnforce
	modeShadow
)

type overrideShard struct {
	mu sync.RWMutex
	m  map[string]Override
	_  [40]byte // keep shards on separate cache lines
}

// NewResolver validates the default quota and rules against the bucket
// count and compiles the rules' globs. Errors name the rule.
func NewResolver(def Quota, rules []Rule, buckets int) (*Resolver, error) {
	if err := def.Validate(buckets); err != nil {
		return nil, fmt.Errorf("default quota: %w", err)
	}
	r := &Resolver{def: def, buckets: buckets}
	for i, rule := range rules {
		name := rule.Name
		if name == "" {
			name = fmt.Sprintf("#%d", i+1)
		}
		cr := compiledRule{Rule: rule}
		cr.Name = name
		if err := rule.Quota.Validate(buckets); err != nil {
			return nil, fmt.Errorf("rule %s: %w", name, err)
		}
		if err := ValidateClasses(rule.Classes, buckets); err != nil {
			return nil, fmt.Errorf("rule %s: %w", name, err)
		}
		if rule.ClientID == "" && rule.Username == "" {
			return nil, fmt.Errorf("rule %s: %w: needs a client_id or username pattern", name, ErrInvalidPattern)
		}
		var err error
		if rule.ClientID != "" {
			if cr.clientID, err = CompileGlob(rule.ClientID); err != nil {
				return nil, fmt.Errorf("rule %s: client_id: %w", name, err)
			}
			cr.hasClientID = true
		}
		if rule.Username != "" {
			if cr.username, err = CompileGlob(rule.Username); err != nil {
				return nil, fmt.Errorf("rule %s: username: %w", name, err)
			}
			cr.hasUsername = true
		}
		if cr.group, err = compileGroup(rule.Group, cr.clientID, cr.username, buckets); err != nil {
			return nil, fmt.Errorf("rule %s: %w", name, err)
		}
		r.rules = append(r.rules, cr)
	}
	for i := range r.shards {
		r.shards[i].m = make(map[string]Override)
	}
	r.modes = make([]atomic.Int32, len(r.rules))
	r.ruleIdx = make(map[string]int, len(r.rules))
	r.blocking.Store(blocks(def, nil))
	for i := range r.rules {
		r.ruleIdx[r.rules[i].Name] = i
		if blocks(r.rules[i].Quota, r.rules[i].Classes) {
			r.blocking.Store(true)
		}
	}
	return r, nil
}

// SetRuleEnforce switches the named rule's own quota between enforcing
// (enforce set) and shadow mode at runtime, from its devices' next
// message; it lasts until the gateway stops (the configuration's
// enforce applies again after a restart). An unknown name is an error
// wrapping ErrUnknownRule.
func (r *Resolver) SetRuleEnforce(name string, enforce bool) error {
	i, ok := r.ruleIdx[name]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownRule, name)
	}
	mode := modeShadow
	if enforce {
		mode = modeEnforce
	}
	r.modes[i].Store(mode)
	r.switched.Store(true)
	return nil
}

// RuleEnforce reports whether the named rule's own quota is enforced
// now (false: shadow mode), and whether the rule exists.
func (r *Resolver) RuleEnforce(name string) (enforce, ok bool) {
	i, ok := r.ruleIdx[name]
	if !ok {
		return false, false
	}
	return !r.ruleShadow(i, r.rules[i].Quota.Shadow), true
}

// ruleShadow returns whether rule i's quota is in shadow mode now, its
// configuration saying configured.
func (r *Resolver) ruleShadow(i int, configured bool) bool {
	if !r.switched.Load() {
		return configured
	}
	switch r.modes[i].Load() {
	case modeEnforce:
		return false
	case modeShadow:
		return true
	}
	return configured
}

// RuleNames returns the rules' names in order.
func (r *Resolver) RuleNames() []string {
	out := make([]string, len(r.rules))
	for i := range r.rules {
		out[i] = r.rules[i].Name
	}
	return out
}

// Buckets returns the bucket count quotas are validated against.
func (r *Resolver) Buckets() int { return r.buckets }

// Default returns the default quota.
func (r *Resolver) Default() Quota { return r.def }

// Rule returns the quota of the first rule matching the client ID and
// username, or the default. It does not consult overrides: callers cache
// it per connection, since neither input changes while connected.
func (r *Resolver) Rule(clientID, username string) (Quota, Source) {
	q, _, src := r.RuleClasses(clientID, username)
	return q, src
}

// RuleClasses is Rule with the rule's (or the default's) topic classes.
func (r *Resolver) RuleClasses(clientID, username string) (Quota, []Class, Source) {
	return r.ruleClasses(r.ruleFor(clientID, username))
}

// RuleGroup is RuleClasses and GroupOf of one match of the rules: what a
// connecting device gets from the configuration. It allocates (the
// group's name): call it once per connection.
func (r *Resolver) RuleGroup(clientID, username string) (Quota, []Class, Source, Membership) {
	i := r.ruleFor(clientID, username)
	q, cs, src := r.ruleClasses(i)
	return q, cs, src, r.groupOf(i, clientID, username)
}

// ruleFor returns the place of the first rule matching the client ID
// and username, -1 when none does (the default applies).
func (r *Resolver) ruleFor(clientID, username string) int {
	for i := range r.rules {
		if r.rules[i].match(clientID, username) {
			return i
		}
	}
	return -1
}

// ruleClasses returns the quota, classes and source of rule i (-1: the
// default), under the rule's runtime enforce switch.
func (r *Resolver) ruleClasses(i int) (Quota, []Class, Source) {
	if i < 0 {
		return r.def, r.classes, Source{Kind: SourceDefault}
	}
	q := r.rules[i].Quota
	q.Shadow = r.ruleShadow(i, q.Shadow)
	return q, r.rules[i].Classes, Source{Kind: SourceRule, Rule: r.rules[i].Name}
}

// ClassNames returns the names of every topic class, the default's and
// the rules', each once, in order of appearance.
func (r *Resolver) ClassNames() []string {
	var out []string
	seen := map[string]bool{}
	add := func(cs []Class) {
		for _, c := range cs {
			if !seen[c.Name] {
				seen[c.Name] = true
				out = append(out, c.Name)
			}
		}
	}
	add(r.classes)
	for _, rule := range r.rules {
		add(rule.Classes)
	}
	return out
}

// SetDefaultGroup puts the devices of the default quota in a group,
// whose template may name {client_id} and {username}. Call it before
// the resolver is shared.
func (r *Resolver) SetDefaultGroup(g *Group) error {
	gr, err := compileGroup(g, Glob{}, Glob{}, r.buckets)
	if err != nil {
		return fmt.Errorf("default: %w", err)
	}
	r.defGroup = gr
	return nil
}

// GroupOf returns the group of a device with this client ID and
// username: its rule's (the first matching, as RuleClasses), or the
// default's. It allocates: call it once per connection.
func (r *Resolver) GroupOf(clientID, username string) Membership {
	return r.groupOf(r.ruleFor(clientID, username), clientID, username)
}

// groupOf is GroupOf under rule i (-1: the default).
func (r *Resolver) groupOf(i int, clientID, username string) Membership {
	if i < 0 {
		return r.defGroup.member(Glob{}, Glob{}, clientID, username)
	}
	cr := &r.rules[i]
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
	var out []string
	add := func(g groupOf) {
		if g.on && !slices.Contains(out, g.tmpl.String()) {
			out = append(out, g.tmpl.String())
		}
	}
	add(r.defGroup)
	for i := range r.rules {
		add(r.rules[i].group)
	}
	return out
}

// GroupConfigured returns the quota and label of the group named name
// when a fixed template of the configuration names it.
func (r *Resolver) GroupConfigured(name string) (Membership, bool) {
	check := func(g groupOf) (Membership, bool) {
		if g.on && g.tmpl.Fixed() && g.tmpl.String() == name {
			return Membership{Name: name, Key: GroupKey(name), Quota: g.quota, Label: name}, true
		}
		return Membership{}, false
	}
	for i := range r.rules {
		if m, ok := check(r.rules[i].group); ok {
			return m, true
		}
	}
	return check(r.defGroup)
}

// SetDefaultClasses gives the devices of the default quota topic
// classes. Call it before the resolver is shared.
func (r *Resolver) SetDefaultClasses(cs []Class) error {
	if err := ValidateClasses(cs, r.buckets); err != nil {
		return fmt.Errorf("default: %w", err)
	}
	r.classes = cs
	if blocks(Quota{}, cs) {
		r.blocking.Store(true)
	}
	return nil
}

// Resolve returns the quota in force for device at now and its source.
func (r *Resolver) Resolve(device, clientID, username string, now Tick) (Quota, Source) {
	if o, ok := r.Override(device, now); ok {
		return o.Quota, Source{Kind: SourceOverride}
	}
	return r.Rule(clientID, username)
}

func (r *Resolver) shard(device string) *overrideShard {
	return &r.shards[hashString(device)%overrideShards]
}

// QuotaAt returns the device's override quota in force at now, else
// rule (the quota its rule gave it, resolved once at connect): the quota
// a publish or a release of the device is counted under.
func (r *Resolver) QuotaAt(device string, rule Quota, now Tick) Quota {
	if o, ok := r.Override(device, now); ok {
		return o.Quota
	}
	return rule
}

// ClassQuotaAt returns the quota of the device's topic class named class
// at now: its override's class of that name, when its override has one,
// else recorded (the class's quota when the message was deferred).
func (r *Resolver) ClassQuotaAt(device, class string, recorded Quota, now Tick) Quota {
	if o, ok := r.Override(device, now); ok {
		for _, c := range o.Classes {
			if c.Name == class {
				return c.Quota
			}
		}
	}
	return recorded
}

// ClassAt returns the topic class and quota a message on topic of the
// device is counted under at now: the first of its classes (its
// override's, when that has classes, else ruleClasses, resolved once at
// connect) whose filter matches, else "" and QuotaAt's quota; rule is
// the quota of the device's rule ruleName ("" for the default), under
// its runtime enforce switch (SetRuleEnforce).
func (r *Resolver) ClassAt(device string, rule Quota, ruleName string, ruleClasses []Class, topic string, now Tick) (string, Quota) {
	q, classes := rule, ruleClasses
	if ruleName != "" && r.switched.Load() {
		if i, ok := r.ruleIdx[ruleName]; ok {
			q.Shadow = r.ruleShadow(i, r.rules[i].Quota.Shadow)
		}
	}
	if o, ok := r.Override(device, now); ok {
		q = o.Quota
		if len(o.Classes) > 0 {
			classes = o.Classes
		}
	}
	if len(classes) > 0 {
		if c, ok := MatchClass(classes, topic); ok {
			return c.Name, c.Quota
		}
	}
	return "", q
}

// Override returns the device's override in force at now. An expired
// override is reported absent (and removed by Prune).
func (r *Resolver) Override(device string, now Tick) (Override, bool) {
	if r.count.Load() == 0 {
		return Override{}, false
	}
	s := r.shard(device)
	s.mu.RLock()
	o, ok := s.m[device]
	s.mu.RUnlock()
	if !ok || o.Expired(now) {
		return Override{}, false
	}
	return o, true
}

// SetOverride sets the device's override after validating it; an invalid
// one changes nothing.
func (r *Resolver) SetOverride(device string, o Override) error {
	if err := o.Validate(device, r.buckets); err != nil {
		return err
	}
	if blocks(o.Quota, o.Classes) {
		r.blocking.Store(true)
	}
	s := r.shard(device)
	s.mu.Lock()
	if _, ok := s.m[device]; !ok {
		r.count.Add(1)
	}
	s.m[device] = o
	s.mu.Unlock()
	return nil
}

// DeleteOverride removes the device's override and reports whether it
// had one.
func (r *Resolver) DeleteOverride(device string) bool {
	s := r.shard(device)
	s.mu.Lock()
	_, ok := s.m[device]
	if ok {
		delete(s.m, device)
		r.count.Add(-1)
	}
	s.mu.Unlock()
	return ok
}

// DeviceOverride is one entry of Overrides.
type DeviceOverride struct {
	Device string
	Override
}

// Overrides returns the overrides in force at now, sorted by device.
func (r *Resolver) Overrides(now Tick) []DeviceOverride {
	var out []DeviceOverride
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.RLock()
		for d, o := range s.m {
			if !o.Expired(now) {
				out = append(out, DeviceOverride{Device: d, Override: o})
			}
		}
		s.mu.RUnlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Device < out[j].Device })
	return out
}

// Prune removes the overrides expired at now and returns their devices.
func (r *Resolver) Prune(now Tick) []string {
	var gone []string
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		for d, o := range s.m {
			if o.Expired(now) {
				delete(s.m, d)
				r.count.Add(-1)
				gone = append(gone, d)
			}
		}
		s.mu.Unlock()
	}
	sort.Strings(gone)
	return gone
}
