package devicelimit

// RuleState is what a rule's runtime enforce switch (SetRuleEnforce)
// covers now: the rule's own quota and its topic classes switch
// together; its group does not (a group's windows are the cap of every
// device in it, which other rules' devices may share, and it has an
// enforce of its own: the group's quota or its override).
type RuleState struct {
	// Enforce reports whether the rule's own quota is enforced (false:
	// shadow mode).
	Enforce bool
	// Classes are the rule's topic classes, with whether each is
	// enforced now; a switch sets them all to the rule's mode.
	Classes []ClassState
	// Group is the template of the rule's group ("" for none): not
	// switched with the rule.
	Group string
	// GroupEnforce is whether the group's configured quota is enforced
	// (a group override may say otherwise for one group).
	GroupEnforce bool
	// GroupShared names the other rules whose group has the same
	// template: their devices count in the same group windows.
	GroupShared []string
}

// ClassState is a topic class's enforce in a RuleState.
type ClassState struct {
	Name    string
	Enforce bool
}

// RuleState returns the named rule's state, and whether it exists.
func (r *Resolver) RuleState(name string) (RuleState, bool) {
	s := r.set.Load()
	i, ok := s.ruleIdx[name]
	if !ok {
		return RuleState{}, false
	}
	return s.state(i, nil), true
}

// state returns rule i's state; with switched set, as that switch set
// it (the rule and its classes in its mode), whatever another switch
// stored since.
func (s *ruleSet) state(i int, switched *bool) RuleState {
	cr := &s.rules[i]
	enforce := func(configured bool) bool {
		if switched != nil {
			return *switched
		}
		return !s.ruleShadow(i, configured)
	}
	st := RuleState{Enforce: enforce(cr.Quota.Shadow)}
	for _, c := range cr.Classes {
		st.Classes = append(st.Classes, ClassState{Name: c.Name, Enforce: enforce(c.Quota.Shadow)})
	}
	if cr.group.on {
		st.Group = cr.group.tmpl.String()
		st.GroupEnforce = !cr.group.quota.Shadow
		for j := range s.rules {
			if j != i && s.rules[j].group.on && s.rules[j].group.tmpl.String() == st.Group {
				st.GroupShared = append(st.GroupShared, s.rules[j].Name)
			}
		}
	}
	return st
}
