package devicelimit

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestGlob(t *testing.T) {
	cases := []struct {
		pattern, s string
		want       bool
	}{
		{"sensor-*", "sensor-1", true},
		{"sensor-*", "sensor-", true},
		{"sensor-*", "sensors", false},
		{"*-eu", "meter-eu", true},
		{"*-eu", "meter-us", false},
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "axxbyy", false},
		{"a*b*c", "abcbc", true},
		{"?at", "cat", true},
		{"?at", "at", false},
		{"a/b/*", "a/b/c/d", true}, // '/' is not special
		{`\*`, "*", true},
		{`\*`, "x", false},
		{"*", "", true},
		{"exact", "exact", true},
		{"exact", "exactly", false},
		{"*?", "", false},
		{"**x", "x", true},
	}
	for _, c := range cases {
		g, err := CompileGlob(c.pattern)
		if err != nil {
			t.Fatal(err)
		}
		if got := g.Match(c.s); got != c.want {
			t.Errorf("%q.Match(%q) = %v, want %v", c.pattern, c.s, got, c.want)
		}
	}
	for _, bad := range []string{"", `a\`} {
		if _, err := CompileGlob(bad); !errors.Is(err, ErrInvalidPattern) {
			t.Errorf("CompileGlob(%q) = %v, want ErrInvalidPattern", bad, err)
		}
	}
}

func TestQuotaValidate(t *testing.T) {
	cases := []struct {
		q       Quota
		buckets int
		want    string // substring of the error, "" for valid
	}{
		{Quota{Limit: 100, Window: 10 * time.Second}, 20, ""},
		{Quota{Limit: 0, Window: time.Second}, 20, "limit must be between 1 and 1000000000 (got 0)"},
		{Quota{Limit: MaxLimit + 1, Window: time.Second}, 20, "(got 1000000001)"},
		{Quota{Limit: 1}, 20, `window must be > 0 (got "0s")`},
		{Quota{Limit: 1, Window: time.Microsecond}, 1, `at least 1ms (got "1µs")`},
		{Quota{Limit: 1, Window: 19 * ms}, 20, "divided into 20 buckets"},
		{Quota{Limit: 1, Window: 20 * ms}, 20, ""},
		{Quota{Limit: 1, Window: 31 * 24 * time.Hour}, 20, "at most 720h0m0s"},
		{Quota{Limit: 1, Window: time.Second, Policy: 9}, 20, "invalid policy"},
		{Quota{Limit: 1, Window: time.Second}, 0, "invalid bucket count"},
	}
	for _, c := range cases {
		err := c.q.Validate(c.buckets)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v/%d: unexpected error %v", c.q, c.buckets, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v/%d: got %v, want error containing %q", c.q, c.buckets, err, c.want)
		}
	}
}

func TestPolicyText(t *testing.T) {
	for _, p := range []Policy{PolicyDrop, PolicyDefer, PolicyDisconnect} {
		b, err := p.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back Policy
		if err := back.UnmarshalText(b); err != nil || back != p {
			t.Fatalf("%v round trip: %v, %v", p, back, err)
		}
	}
	if _, err := ParsePolicy("block"); err == nil || !strings.Contains(err.Error(), `(got "block")`) {
		t.Fatalf("ParsePolicy(block) = %v", err)
	}
}

func TestResolverPrecedence(t *testing.T) {
	def := Quota{Limit: 100, Window: 10 * time.Second}
	sensors := Quota{Limit: 10, Window: time.Second}
	fleetA := Quota{Limit: 5, Window: time.Second, Policy: PolicyDisconnect}
	r, err := NewResolver(def, []Rule{
		{Name: "sensors", ClientID: "sensor-*", Quota: sensors},
		{Name: "fleet-a", Username: "fleet-a", Quota: fleetA},
		{ClientID: "sensor-*", Username: "fleet-a", Quota: def}, // shadowed by the first
	}, 20)
	if err != nil {
		t.Fatal(err)
	}
	check := func(dev, cid, user string, now Tick, wantQ Quota, wantSrc string) {
		t.Helper()
		q, src := r.Resolve(dev, cid, user, now)
		if q != wantQ || src.String() != wantSrc {
			t.Fatalf("Resolve(%q,%q,%q) = %v from %v, want %v from %v", dev, cid, user, q, src, wantQ, wantSrc)
		}
	}
	check("sensor-1", "sensor-1", "fleet-a", t0, sensors, "rule:sensors") // first match wins
	check("meter-1", "meter-1", "fleet-a", t0, fleetA, "rule:fleet-a")
	check("meter-2", "meter-2", "", t0, def, "default")

	over := Quota{Limit: 1, Window: time.Minute}
	if err := r.SetOverride("sensor-1", Override{Quota: over, ExpiresAt: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	check("sensor-1", "sensor-1", "", t0, over, "override")
	check("sensor-1", "sensor-1", "", t0.Add(time.Hour), sensors, "rule:sensors") // lapsed
	if got := r.Overrides(t0); len(got) != 1 || got[0].Device != "sensor-1" {
		t.Fatalf("Overrides = %+v", got)
	}
	if got := r.Prune(t0.Add(time.Hour)); len(got) != 1 || got[0] != "sensor-1" {
		t.Fatalf("Prune = %v", got)
	}
	if r.DeleteOverride("sensor-1") {
		t.Fatal("pruned override still deletable")
	}

	// A bad override changes nothing.
	if err := r.SetOverride("meter-1", Override{Quota: Quota{Limit: 0, Window: time.Second}}); !errors.Is(err, ErrInvalidQuota) {
		t.Fatalf("bad override: %v", err)
	}
	if err := r.SetOverride("", Override{Quota: over}); !errors.Is(err, ErrInvalidDevice) {
		t.Fatalf("empty device: %v", err)
	}
	check("meter-1", "meter-1", "fleet-a", t0, fleetA, "rule:fleet-a")
	if err := r.SetOverride("meter-1", Override{Quota: over}); err != nil {
		t.Fatal(err)
	}
	if !r.DeleteOverride("meter-1") {
		t.Fatal("DeleteOverride found nothing")
	}
	check("meter-1", "meter-1", "fleet-a", t0, fleetA, "rule:fleet-a")
}

func TestNewResolverErrorsNameTheRule(t *testing.T) {
	def := Quota{Limit: 1, Window: time.Second}
	cases := []struct {
		rules []Rule
		want  string
	}{
		{[]Rule{{Name: "x", ClientID: "a*", Quota: Quota{Limit: 0, Window: time.Second}}}, "rule x: invalid quota: limit"},
		{[]Rule{{Quota: def}}, "rule #1: invalid pattern"},
		{[]Rule{{Name: "y", ClientID: `a\`, Quota: def}}, "rule y: client_id: invalid pattern"},
	}
	for _, c := range cases {
		if _, err := NewResolver(def, c.rules, 20); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
	if _, err := NewResolver(Quota{}, nil, 20); err == nil || !strings.Contains(err.Error(), "default quota") {
		t.Errorf("zero default: %v", err)
	}
}

func TestIdentity(t *testing.T) {
	if IdentityClientID.Of("c", "u") != "c" || IdentityUsername.Of("c", "u") != "u" {
		t.Fatal("Of picks the wrong field")
	}
	for _, s := range []string{"client_id", "username"} {
		i, err := ParseIdentity(s)
		if err != nil || i.String() != s {
			t.Fatalf("ParseIdentity(%q) = %v, %v", s, i, err)
		}
	}
	if _, err := ParseIdentity("ip"); err == nil || !strings.Contains(err.Error(), `(got "ip")`) {
		t.Fatalf("ParseIdentity(ip) = %v", err)
	}
}

// TestResolverMayBlock: MayBlock is false while no quota has a block,
// and true once the configuration or an override gives one.
func TestResolverMayBlock(t *testing.T) {
	q := Quota{Limit: 5, Window: time.Second}
	r, err := NewResolver(q, []Rule{{Name: "a", ClientID: "a-*", Quota: q}}, DefaultBuckets)
	if err != nil {
		t.Fatal(err)
	}
	if r.MayBlock() {
		t.Fatal("MayBlock without any block")
	}
	blocked := q
	blocked.Block = Block{After: 3, Within: time.Second, For: time.Minute}
	if err := r.SetOverride("d", Override{Quota: blocked}); err != nil || !r.MayBlock() {
		t.Fatalf("after an override with a block: MayBlock %v (%v)", r.MayBlock(), err)
	}
	r2, err := NewResolver(q, []Rule{{Name: "b", ClientID: "b-*", Quota: q, Classes: []Class{{Name: "c", Topics: []string{"x"}, Quota: blocked}}}}, DefaultBuckets)
	if err != nil || !r2.MayBlock() {
		t.Fatalf("a rule's class with a block: MayBlock %v (%v)", r2.MayBlock(), err)
	}
}
