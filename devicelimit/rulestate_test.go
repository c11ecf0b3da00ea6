package devicelimit

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

// TestRuleSwitchCoversClasses: a rule's runtime switch puts its topic
// classes in its mode with its own quota (ClassAt, RuleClasses,
// RuleState), not an override's classes, and not its group, which
// RuleState names with the rules sharing it; ClassAt allocates nothing
// for a switched rule.
func TestRuleSwitchCoversClasses(t *testing.T) {
	hour := time.Hour
	shadow := Quota{Limit: 1, Window: hour, Shadow: true}
	alarms := []Class{{Name: "alarms", Topics: []string{"alarms/#"}, Quota: shadow}}
	group := &Group{Name: "fleet", Quota: Quota{Limit: 100, Window: hour, Shadow: true}}
	r, err := NewResolver(Quota{Limit: 10, Window: hour}, []Rule{
		{Name: "meters", ClientID: "meter-*", Quota: shadow, Classes: alarms, Group: group},
		{Name: "pumps", ClientID: "pump-*", Quota: Quota{Limit: 1, Window: hour}, Group: group},
	}, 10)
	if err != nil {
		t.Fatal(err)
	}
	rule, classes, _ := r.RuleClasses("meter-1", "")
	if _, q := r.ClassAt("meter-1", rule, "meters", classes, "alarms/1", 0); !q.Shadow {
		t.Fatal("the class is enforced before any switch")
	}
	switched, err := r.SetRuleEnforce("meters", true)
	if err != nil {
		t.Fatal(err)
	}
	// A connection from before the switch holds the configured classes.
	if name, q := r.ClassAt("meter-1", rule, "meters", classes, "alarms/1", 0); name != "alarms" || q.Shadow {
		t.Fatalf("ClassAt after the switch: %q shadow %v, want alarms enforced", name, q.Shadow)
	}
	if _, cs, _ := r.RuleClasses("meter-2", ""); cs[0].Quota.Shadow || !r.set.Load().rules[0].Classes[0].Quota.Shadow {
		t.Fatal("RuleClasses after the switch: want the class enforced, the configuration's copy untouched")
	}
	if n := testing.AllocsPerRun(100, func() { r.ClassAt("meter-1", rule, "meters", classes, "alarms/1", 0) }); n != 0 {
		t.Fatalf("ClassAt of a switched rule allocated %v times", n)
	}
	st, ok := r.RuleState("meters")
	want := RuleState{Enforce: true, Classes: []ClassState{{Name: "alarms", Enforce: true}}, Group: "fleet", GroupShared: []string{"pumps"}}
	if !ok || !reflect.DeepEqual(st, want) {
		t.Fatalf("RuleState = %+v, %v, want %+v", st, ok, want)
	}
	if !reflect.DeepEqual(switched, want) {
		t.Fatalf("SetRuleEnforce's state = %+v, want %+v", switched, want)
	}
	// An override's classes are its own: the rule's switch leaves them.
	if err := r.SetOverride("meter-3", Override{Quota: Quota{Limit: 5, Window: hour}, Classes: alarms}); err != nil {
		t.Fatal(err)
	}
	if _, q := r.ClassAt("meter-3", rule, "meters", classes, "alarms/1", 0); !q.Shadow {
		t.Fatal("the rule's switch enforced an override's class")
	}
	if _, ok := r.RuleState("valves"); ok {
		t.Fatal("RuleState of an unknown rule")
	}
	// The answer is the switched rules' whatever comes after: another
	// switch, a reload that removes the rule.
	if _, err := r.SetRuleEnforce("meters", false); err != nil {
		t.Fatal(err)
	}
	n, err := NewResolver(Quota{Limit: 10, Window: hour}, nil, 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Reconfigure(n); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(switched, want) {
		t.Fatalf("SetRuleEnforce's state changed after it to %+v", switched)
	}
	if _, ok := r.RuleState("meters"); ok {
		t.Fatal("RuleState of a rule the reload removed")
	}
	if _, err := r.SetRuleEnforce("meters", true); !errors.Is(err, ErrUnknownRule) {
		t.Fatalf("switch of a removed rule: %v, want ErrUnknownRule", err)
	}
}
