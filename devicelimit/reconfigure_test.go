package devicelimit

import (
	"errors"
	"testing"
	"time"
)

// TestResolverReconfigure: the new rules and default apply at once, the
// overrides stay, a runtime enforce switch ends, and a resolver of
// another bucket count is refused, changing nothing.
func TestResolverReconfigure(t *testing.T) {
	q := func(n int) Quota { return Quota{Limit: n, Window: time.Minute} }
	r, err := NewResolver(q(10), []Rule{{Name: "s", ClientID: "s-*", Quota: q(5)}}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetOverride("o-1", Override{Quota: q(7)}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.SetRuleEnforce("s", false); err != nil {
		t.Fatal(err)
	}
	n, err := NewResolver(q(20), []Rule{{Name: "t", ClientID: "t-*", Quota: q(3)}, {Name: "s", ClientID: "s-*", Quota: q(4)}}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Reconfigure(n); err != nil {
		t.Fatal(err)
	}
	if got, src := r.Rule("s-1", ""); got.Limit != 4 || got.Shadow || src.Rule != "s" {
		t.Fatalf("s-1 after: %+v %v, want rule s's 4, enforced", got, src)
	}
	if got, src := r.Rule("t-1", ""); got.Limit != 3 || src.Rule != "t" {
		t.Fatalf("t-1 after: %+v %v", got, src)
	}
	if r.Default().Limit != 20 || len(r.RuleNames()) != 2 {
		t.Fatalf("default %d, rules %v", r.Default().Limit, r.RuleNames())
	}
	if got, src := r.Resolve("o-1", "s-9", "", 0); got.Limit != 7 || src.Kind != SourceOverride {
		t.Fatalf("override after: %+v %v", got, src)
	}
	other, err := NewResolver(q(1), nil, 20)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Reconfigure(other); !errors.Is(err, ErrInvalidQuota) || r.Default().Limit != 20 {
		t.Fatalf("another bucket count: %v, default %d", err, r.Default().Limit)
	}
}
