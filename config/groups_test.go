package config

import (
	"strings"
	"testing"
	"time"
)

// TestGroupConfig: a rule's group and the default's parse into the
// resolver's groups, templates filled from the named parts of the
// rule's patterns.
func TestGroupConfig(t *testing.T) {
	c, err := Parse(strings.NewReader(`limits:
  default: {limit: 10, window: 1m}
  group: {name: "user-{username}", quota: {limit: 500, window: 1m}}
  rules:
    - name: tenants
      match: {client_id: "tenant-{tenant}-*"}
      quota: {limit: 5, window: 10s}
      group:
        name: "{tenant}"
        quota: {windows: [{messages: 100, window: 10s}, {bytes: 1MiB, window: 1h}], enforce: false}
`))
	if err == nil {
		err = c.Validate()
	}
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Resolver()
	if err != nil {
		t.Fatal(err)
	}
	m := res.GroupOf("tenant-acme-17", "")
	if m.Name != "acme" || m.Label != "{tenant}" || !m.Quota.Shadow || m.Quota.NWindows != 2 || m.Quota.Windows[1].N != 1<<20 {
		t.Fatalf("tenant group %+v", m)
	}
	m = res.GroupOf("other", "bob")
	if m.Name != "user-bob" || m.Quota.Limit != 500 || m.Quota.Window != time.Minute || m.Quota.Shadow {
		t.Fatalf("default group %+v", m)
	}
}

// TestGroupConfigErrors: bad groups are refused naming the key and the
// value.
func TestGroupConfigErrors(t *testing.T) {
	rule := func(group string) string {
		return `limits:
  default: {limit: 10, window: 1m}
  rules:
    - match: {client_id: "tenant-{tenant}-*"}
      quota: {limit: 5, window: 10s}
      group: ` + group + "\n"
	}
	for _, tc := range []struct{ yaml, want string }{
		{rule(`{name: "{tenat}", quota: {limit: 100, window: 10s}}`), `limits.rules[0].group.name: names the part {tenat}, which is not one of {client_id}, {username}, {tenant} (got "{tenat}")`},
		{rule(`{name: "{tenant", quota: {limit: 100, window: 10s}}`), `limits.rules[0].group.name: has a '{' that does not start a part {name}`},
		{rule(`{name: "", quota: {limit: 100, window: 10s}}`), "limits.rules[0].group.name: must name the group"},
		{rule(`{name: acme, quota: {enforce: false}}`), "limits.rules[0].group.quota.enforce: sets shadow mode on windows that do not exist"},
		{rule(`{name: acme}`), "limits.rules[0].group.quota: a group needs windows of its own"},
		{rule(`{name: acme, quota: {limit: 0, window: 10s}}`), "limits.rules[0].group.quota.limit: must be between 1 and 1000000000 (got 0)"},
		{rule(`{name: acme, quota: {limit: 10, window: 10s, windows: [{messages: 1, window: 1s}]}}`), "limits.rules[0].group.quota.windows: give limit and window, or windows, not both"},
		{rule(`{name: acme, quota: {limit: 10, window: 10s, block: {after: 5, within: 1m, for: 1m}}}`), "limits.rules[0].group.quota.block: a group has no block"},
		{rule(`{name: acme, quota: {limit: 10, window: 10s, policy: disconnect}}`), "limits.rules[0].group.quota.policy: a group has no policy: the device's applies (got disconnect)"},
		{`limits:
  default: {limit: 10, window: 1m, policy: defer}
  group: {name: all, quota: {limit: 10, window: 10s}}
`, "limits.default.policy: defer cannot be used with a group"},
		{`limits:
  default: {limit: 10, window: 1m}
  group: {name: "{tenant}", quota: {limit: 10, window: 10s}}
`, "limits.group.name: names the part {tenant}, which is not one of {client_id}, {username}"},
		{rule(`{name: acme, quota: {limit: 10, window: 10s}}`) + `cluster: {redis: {addrs: ["127.0.0.1:7000", "127.0.0.1:7001"]}, decisions: redis}`, "limits.rules[0].group: groups need one Redis server, not Redis Cluster"},
		{rule(`{name: acme, quota: {limit: 100, window: 10s}}`) + `    - match: {client_id: "acme-*"}
      quota: {limit: 5, window: 10s}
      group: {name: acme, quota: {limit: 100, window: 10s, enforce: false}}
`, `limits.rules[1].group.quota: group "acme" is also made by limits.rules[0].group with another quota (100 messages per 10s, here 100 messages per 10s in shadow mode): give one group one quota`},
		{rule(`{name: all, quota: {limit: 100, window: 10s}}`) + `  group: {name: all, quota: {limit: 50, window: 10s}}
`, `limits.group.quota: group "all" is also made by limits.rules[0].group with another quota (100 messages per 10s, here 50 messages per 10s)`},
	} {
		c, err := Parse(strings.NewReader(tc.yaml))
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v\nwant %q", tc.yaml, err, tc.want)
		}
	}
	// Two rules making one group with one quota, and a template's
	// groups beside a fixed one: accepted.
	same := rule(`{name: acme, quota: {limit: 100, window: 10s}}`) + `    - match: {client_id: "acme-*"}
      quota: {limit: 5, window: 10s}
      group: {name: acme, quota: {limit: 100, window: 10s}}
    - match: {client_id: "t-{tenant}-*"}
      quota: {limit: 5, window: 10s}
      group: {name: "{tenant}", quota: {limit: 7, window: 10s}}
`
	if c, err := Parse(strings.NewReader(same)); err != nil || c.Validate() != nil {
		t.Fatalf("one group, one quota: %v %v", err, c.Validate())
	}
	// Groups on Redis Cluster in owner mode, explicit or the default:
	// accepted.
	for _, decisions := range []string{", decisions: owner", ""} {
		owner := rule(`{name: acme, quota: {limit: 10, window: 10s}}`) + `cluster: {redis: {addrs: ["127.0.0.1:7000", "127.0.0.1:7001"]}` + decisions + `}`
		if c, err := Parse(strings.NewReader(owner)); err != nil || c.Validate() != nil {
			t.Fatalf("groups on Redis Cluster in owner mode (%q): %v %v", decisions, err, c.Validate())
		}
	}
}
