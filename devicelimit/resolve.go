package devicelimit

import (
	"fmt"
	"slices"
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

// Resolver decides which quota applies to a device: a runtime override
// for its ID, else the first config rule matching its client ID and
// username, else the default. Overrides change at runtime and apply
// from the device's next message; the default and rules change as a
// whole with Reconfigure (a configuration reload). Safe for concurrent
// use.
type Resolver struct {
	// set is the default quota and rules in force; Reconfigure
	// replaces it whole, so that a reader sees one configuration.
	set     atomic.Pointer[ruleSet]
	buckets int

	count  atomic.Int64 // number of overrides, so the common no-override case takes no lock
	shards [overrideShards]overrideShard

	// blocking is set once any quota, configured or an override's, has
	// a block: until then no device can be blocked (MayBlock).
	blocking atomic.Bool

	// gen counts the changes of what a device may be told of its
	// quotas (Generation).
	gen atomic.Uint64
}

// Generation returns a number that changes whenever a quota may have
// changed: an override set, deleted or pruned, a reconfiguration, a
// rule's enforce switch. (An override that expires changes nothing
// here until Prune: a caller keeps its ExpiresAt.) A device's feedback
// compares it to notice a new contract cheaply.
func (r *Resolver) Generation() uint64 { return r.gen.Load() }

// ruleSet is a configuration's default quota, classes, group and rules.
type ruleSet struct {
	def      Quota
	classes  []Class // the default's topic classes
	defGroup groupOf // the default's group
	rules    []compiledRule

	// modes are the rules' runtime enforce switches (SetRuleEnforce),
	// by rule index: modeConfigured, modeEnforce or modeShadow.
	modes   []atomic.Int32
	ruleIdx map[string]int
	// switched is set once any was switched, so the common case reads
	// one atomic.
	switched atomic.Bool
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

// NewResolver validates the default quota and rules against the bucket
// count and compiles the rules' globs. Errors name the rule.
func NewResolver(def Quota, rules []Rule, buckets int) (*Resolver, error) {
	if err := def.Validate(buckets); err != nil {
		return nil, fmt.Errorf("default quota: %w", err)
	}
	r := &Resolver{buckets: buckets}
	s := &ruleSet{def: def}
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
		s.rules = append(s.rules, cr)
	}
	for i := range r.shards {
		r.shards[i].m = make(map[string]Override)
	}
	s.modes = make([]atomic.Int32, len(s.rules))
	s.ruleIdx = make(map[string]int, len(s.rules))
	r.blocking.Store(blocks(def, nil))
	for i := range s.rules {
		s.ruleIdx[s.rules[i].Name] = i
		if blocks(s.rules[i].Quota, s.rules[i].Classes) {
			r.blocking.Store(true)
		}
	}
	r.set.Store(s)
	return r, nil
}

// Reconfigure puts n's default quota, classes, group and rules in force
// in r, at once: a device's next message is judged by them (callers
// holding a device's rule quota from its connection look it up again,
// see broker.Server.Reconfigure); its windows keep their counts, and
// the overrides stay. n must have r's bucket count. The rules' runtime
// enforce switches (SetRuleEnforce) end: the new configuration's
// enforce applies.
func (r *Resolver) Reconfigure(n *Resolver) error {
	if n.buckets != r.buckets {
		return fmt.Errorf("%w: the bucket count cannot change (%d, now %d)", ErrInvalidQuota, r.buckets, n.buckets)
	}
	r.set.Store(n.set.Load())
	r.gen.Add(1)
	if n.blocking.Load() {
		r.blocking.Store(true)
	}
	return nil
}

// SetRuleEnforce switches the named rule's own quota between enforcing
// (enforce set) and shadow mode at runtime, from its devices' next
// message; it lasts until the gateway stops (the configuration's
// enforce applies again after a restart). It returns the rule's state
// as this switch set it, read from the rules it switched: a reload or
// another switch right after it cannot change the answer. An unknown
// name is an error wrapping ErrUnknownRule.
func (r *Resolver) SetRuleEnforce(name string, enforce bool) (RuleState, error) {
	s := r.set.Load()
	i, ok := s.ruleIdx[name]
	if !ok {
		return RuleState{}, fmt.Errorf("%w: %q", ErrUnknownRule, name)
	}
	mode := modeShadow
	if enforce {
		mode = modeEnforce
	}
	s.modes[i].Store(mode)
	s.switched.Store(true)
	r.gen.Add(1)
	return s.state(i, &enforce), nil
}

// RuleEnforce reports whether the named rule's own quota is enforced
// now (false: shadow mode), and whether the rule exists.
func (r *Resolver) RuleEnforce(name string) (enforce, ok bool) {
	s := r.set.Load()
	i, ok := s.ruleIdx[name]
	if !ok {
		return false, false
	}
	return !s.ruleShadow(i, s.rules[i].Quota.Shadow), true
}

// ruleShadow returns whether rule i's quota is in shadow mode now, its
// configuration saying configured.
func (s *ruleSet) ruleShadow(i int, configured bool) bool {
	if !s.switched.Load() {
		return configured
	}
	switch s.modes[i].Load() {
	case modeEnforce:
		return false
	case modeShadow:
		return true
	}
	return configured
}

// RuleNames returns the rules' names in order.
func (r *Resolver) RuleNames() []string {
	s := r.set.Load()
	out := make([]string, len(s.rules))
	for i := range s.rules {
		out[i] = s.rules[i].Name
	}
	return out
}

// Buckets returns the bucket count quotas are validated against.
func (r *Resolver) Buckets() int { return r.buckets }

// Default returns the default quota.
func (r *Resolver) Default() Quota { return r.set.Load().def }

// Rule returns the quota of the first rule matching the client ID and
// username, or the default. It does not consult overrides: callers cache
// it per connection, since neither input changes while connected.
func (r *Resolver) Rule(clientID, username string) (Quota, Source) {
	s := r.set.Load()
	i := s.ruleFor(clientID, username)
	if i < 0 {
		return s.def, Source{Kind: SourceDefault}
	}
	q := s.rules[i].Quota
	q.Shadow = s.ruleShadow(i, q.Shadow)
	return q, Source{Kind: SourceRule, Rule: s.rules[i].Name}
}

// RuleClasses is Rule with the rule's (or the default's) topic classes.
func (r *Resolver) RuleClasses(clientID, username string) (Quota, []Class, Source) {
	s := r.set.Load()
	return s.ruleClasses(s.ruleFor(clientID, username))
}

// RuleGroup is RuleClasses and GroupOf of one match of the rules: what a
// connecting device gets from the configuration. It allocates (the
// group's name): call it once per connection.
func (r *Resolver) RuleGroup(clientID, username string) (Quota, []Class, Source, Membership) {
	s := r.set.Load()
	i := s.ruleFor(clientID, username)
	q, cs, src := s.ruleClasses(i)
	return q, cs, src, s.groupOf(i, clientID, username)
}

// ruleFor returns the place of the first rule matching the client ID
// and username, -1 when none does (the default applies).
func (s *ruleSet) ruleFor(clientID, username string) int {
	for i := range s.rules {
		if s.rules[i].match(clientID, username) {
			return i
		}
	}
	return -1
}

// ruleClasses returns the quota, classes and source of rule i (-1: the
// default), under the rule's runtime enforce switch, which switches its
// classes too (a copy of them, then).
func (s *ruleSet) ruleClasses(i int) (Quota, []Class, Source) {
	if i < 0 {
		return s.def, s.classes, Source{Kind: SourceDefault}
	}
	q := s.rules[i].Quota
	q.Shadow = s.ruleShadow(i, q.Shadow)
	cs := s.rules[i].Classes
	if s.switched.Load() && s.modes[i].Load() != modeConfigured && len(cs) > 0 {
		cs = slices.Clone(cs)
		for j := range cs {
			cs[j].Quota.Shadow = s.ruleShadow(i, cs[j].Quota.Shadow)
		}
	}
	return q, cs, Source{Kind: SourceRule, Rule: s.rules[i].Name}
}

// ClassNames returns the names of every topic class, the default's and
// the rules', each once, in order of appearance.
func (r *Resolver) ClassNames() []string {
	s := r.set.Load()
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
	add(s.classes)
	for _, rule := range s.rules {
		add(rule.Classes)
	}
	return out
}

// SetDefaultClasses gives the devices of the default quota topic
// classes. Call it before the resolver is shared.
func (r *Resolver) SetDefaultClasses(cs []Class) error {
	s := r.set.Load()
	if err := ValidateClasses(cs, r.buckets); err != nil {
		return fmt.Errorf("default: %w", err)
	}
	s.classes = cs
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

// QuotaAt returns the device's override quota in force at now, else
// rule: the quota its rule gave it (resolved once at connect), or the
// one a message was deferred under, which a release of a device not
// connected is counted under (a connected device's publishes and
// releases resolve by ClassAt).
func (r *Resolver) QuotaAt(device string, rule Quota, now Tick) Quota {
	if o, ok := r.Override(device, now); ok {
		return o.Quota
	}
	return rule
}

// ClassQuotaAt returns the quota of the device's topic class named class
// at now: its override's class of that name, when its override has one,
// else recorded (the class's quota when the message was deferred): what
// a release of a device not connected is counted under.
func (r *Resolver) ClassQuotaAt(device, class string, recorded Quota, now Tick) Quota {
	if o, ok := r.Override(device, now); ok {
		if c, ok := ClassNamed(o.Classes, class); ok {
			return c.Quota
		}
	}
	return recorded
}

// ClassNamed returns the class of cs named name.
func ClassNamed(cs []Class, name string) (*Class, bool) {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i], true
		}
	}
	return nil, false
}

// contract returns the quota and topic classes device is under at now
// (see ContractAt), the index of the switched rule whose classes these
// are (-1: none, or an override's), and the instant its override
// expires (0: none).
func (r *Resolver) contract(device string, rule Quota, ruleName string, ruleClasses []Class, now Tick) (*ruleSet, Quota, []Class, int, Tick) {
	s := r.set.Load()
	q, classes := rule, ruleClasses
	ri := -1 // the switched rule whose classes these are
	if ruleName != "" && s.switched.Load() {
		if i, ok := s.ruleIdx[ruleName]; ok {
			ri = i
			q.Shadow = s.ruleShadow(i, s.rules[i].Quota.Shadow)
		}
	}
	if o, ok := r.Override(device, now); ok {
		q = o.Quota
		if len(o.Classes) > 0 {
			classes, ri = o.Classes, -1
		}
		return s, q, classes, ri, o.ExpiresAt
	}
	return s, q, classes, ri, 0
}

// ContractAt returns the quota and topic classes device is under at
// now: its override's, when it has one (the override's classes, when it
// has any, else ruleClasses), else rule and ruleClasses, as ClassAt
// resolves them, under the rule's runtime enforce switch (which switches
// its classes too: a copy of them then); and the instant its override
// expires (0: none, or no override).
func (r *Resolver) ContractAt(device string, rule Quota, ruleName string, ruleClasses []Class, now Tick) (Quota, []Class, Tick) {
	s, q, classes, ri, until := r.contract(device, rule, ruleName, ruleClasses, now)
	if ri >= 0 && len(classes) > 0 && s.modes[ri].Load() != modeConfigured {
		classes = slices.Clone(classes)
		for j := range classes {
			classes[j].Quota.Shadow = s.ruleShadow(ri, classes[j].Quota.Shadow)
		}
	}
	return q, classes, until
}

// ClassAt returns the topic class and quota a message on topic of the
// device is counted under at now: the first of its classes (its
// override's, when that has classes, else ruleClasses, resolved once at
// connect) whose filter matches, else "" and QuotaAt's quota; rule is
// the quota of the device's rule ruleName ("" for the default), under
// its runtime enforce switch (SetRuleEnforce), which switches the rule's
// classes too (not an override's). It allocates nothing.
func (r *Resolver) ClassAt(device string, rule Quota, ruleName string, ruleClasses []Class, topic string, now Tick) (string, Quota) {
	if len(ruleClasses) == 0 && r.count.Load() == 0 && (ruleName == "" || !r.set.Load().switched.Load()) {
		// The common case, a rule without classes, no override and no
		// switched rule: the rule's quota as given, without contract's
		// copies of it (measured 10 % of an admitted publish).
		return "", rule
	}
	s, q, classes, ri, _ := r.contract(device, rule, ruleName, ruleClasses, now)
	if len(classes) > 0 {
		if c, ok := MatchClass(classes, topic); ok {
			if ri < 0 {
				return c.Name, c.Quota
			}
			cq := c.Quota
			cq.Shadow = s.ruleShadow(ri, cq.Shadow)
			return c.Name, cq
		}
	}
	return "", q
}
