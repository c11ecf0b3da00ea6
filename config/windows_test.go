package config

import (
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestQuotaWindows: a quota of several windows parses into devicelimit's
// terms; a rule that gives no quota keys takes the default's windows;
// bad windows are refused naming the key and the value.
func TestQuotaWindows(t *testing.T) {
	good := `limits:
  default:
    windows:
      - {messages: 10, window: 1m}
      - {messages: 1000, window: 24h}
      - {bytes: 5MiB, window: 24h}
  rules:
    - {match: {client_id: "own-*"}, quota: {limit: 5, window: 1s}}
    - {match: {client_id: "inherits-*"}, quota: {policy: disconnect}}
`
	c, err := Parse(strings.NewReader(good))
	if err == nil {
		err = c.Validate()
	}
	if err != nil {
		t.Fatal(err)
	}
	want := devicelimit.WithWindows(devicelimit.PolicyDrop,
		devicelimit.Limit{Unit: devicelimit.Messages, N: 10, Window: time.Minute},
		devicelimit.Limit{Unit: devicelimit.Messages, N: 1000, Window: 24 * time.Hour},
		devicelimit.Limit{Unit: devicelimit.Bytes, N: 5 << 20, Window: 24 * time.Hour})
	if got := c.Limits.Default.Quota(); got != want {
		t.Fatalf("default %v, want %v", got, want)
	}
	if got := c.Limits.Rules[0].Quota.Quota(); got != (devicelimit.Quota{Limit: 5, Window: time.Second}) {
		t.Fatalf("rule with its own limit: %v", got)
	}
	inherit := want
	inherit.Policy = devicelimit.PolicyDisconnect
	if got := c.Limits.Rules[1].Quota.Quota(); got != inherit {
		t.Fatalf("rule giving no windows: %v, want the default's windows %v", got, inherit)
	}
	for _, tc := range []struct{ yaml, want string }{
		{`limits: {default: {limit: 5, windows: [{messages: 1, window: 1s}]}}`, `limits.default.windows: give limit and window, or windows, not both`},
		{`limits: {rules: [{match: {client_id: a}, quota: {window: 5s, windows: [{messages: 1, window: 1s}]}}]}`, `limits.rules[0].quota.windows: give limit and window, or windows, not both`},
		{`limits: {default: {windows: [{messages: 1, bytes: 10, window: 1s}]}}`, `limits.default.windows[0]: give messages or bytes, one of them (got messages 1, bytes 10)`},
		{`limits: {default: {windows: [{window: 1s}]}}`, `limits.default.windows[0]: give messages or bytes, one of them (got messages 0, bytes 0)`},
		{`limits: {default: {windows: [{messages: 1, window: 1s}, {messages: 2, window: 2s}, {messages: 3, window: 3s}, {messages: 4, window: 4s}, {messages: 5, window: 5s}]}}`, `limits.default.windows: must hold 1 to 4 windows (got 5)`},
		{`limits: {default: {windows: [{bytes: 5GiB, window: 1s}]}}`, `limits.default.windows[0].bytes: must be between 1 and 4294967295 (got 5368709120)`},
		{`limits: {default: {windows: [{messages: 5, window: 0s}]}}`, `limits.default.windows[0].window: must be > 0`},
		{`limits: {default: {windows: [{messages: 5, window: 1s, burst: 2}]}}`, `limits.default.windows[0].burst: unknown key`},
	} {
		c, err := Parse(strings.NewReader(tc.yaml))
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

// TestTopicClassesConfig: classes parse on a rule and under limits, into
// the resolver; bad classes are refused naming the key and value.
func TestTopicClassesConfig(t *testing.T) {
	good := `limits:
  classes:
    - {name: status, topics: ["status/#"], quota: {limit: 1, window: 1m}}
  rules:
    - match: {client_id: "meter-*"}
      quota: {limit: 10, window: 1m}
      classes:
        - name: alarms
          topics: ["devices/+/alarm/#"]
          quota: {windows: [{messages: 100, window: 1h}, {bytes: 1MiB, window: 24h}], policy: disconnect}
`
	c, err := Parse(strings.NewReader(good))
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
	_, cs, _ := res.RuleClasses("meter-1", "")
	if len(cs) != 1 || cs[0].Name != "alarms" || cs[0].Quota.NWindows != 2 || cs[0].Quota.Policy != devicelimit.PolicyDisconnect {
		t.Fatalf("rule classes %+v", cs)
	}
	if _, cs, _ = res.RuleClasses("sensor-1", ""); len(cs) != 1 || cs[0].Name != "status" {
		t.Fatalf("default classes %+v", cs)
	}
	for _, tc := range []struct{ yaml, want string }{
		{`limits: {classes: [{name: "", topics: [a], quota: {limit: 1, window: 1s}}]}`, `limits.classes[0].name: must be 1 to 64 bytes without NUL (got "")`},
		{`limits: {classes: [{name: a, topics: [a], quota: {limit: 1, window: 1s}}, {name: a, topics: [b], quota: {limit: 1, window: 1s}}]}`, `limits.classes[1].name: "a" is also the name of limits.classes[0]`},
		{`limits: {classes: [{name: a, topics: ["a/#/b"], quota: {limit: 1, window: 1s}}]}`, `limits.classes[0].topics[0]: is not a valid topic filter`},
		{`limits: {classes: [{name: a, topics: [], quota: {limit: 1, window: 1s}}]}`, `limits.classes[0].topics: must list at least one topic filter`},
		{`limits: {classes: [{name: a, topics: [a]}]}`, `limits.classes[0].quota: a class needs a quota of its own`},
		{`limits: {classes: [{name: a, topics: [a], quota: {limit: 0, window: 1s}}]}`, `limits.classes[0].quota.limit: must be between 1 and 1000000000 (got 0)`},
		{`limits: {rules: [{match: {client_id: a}, classes: [{name: a, topics: [a], quota: {limit: 1, windows: [{messages: 1, window: 1s}]}}]}]}`, `limits.rules[0].classes[0].quota.windows: give limit and window, or windows, not both`},
	} {
		c, err := Parse(strings.NewReader(tc.yaml))
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

// TestEnforceConfig: enforce: false puts the quota it is written on in
// shadow mode (the default's, a rule's, a class's); it is not inherited
// by a rule; a value that is not a boolean is refused naming the key.
func TestEnforceConfig(t *testing.T) {
	c, err := Parse(strings.NewReader(`limits:
  default: {limit: 10, window: 1m, enforce: false}
  rules:
    - name: meters
      match: {client_id: "meter-*"}
      quota: {limit: 5, window: 1s}
      classes: [{name: alarms, topics: ["a/#"], quota: {limit: 1, window: 1s, enforce: false}}]
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
	if !res.Default().Shadow {
		t.Fatal("limits.default with enforce: false is enforced")
	}
	q, classes, _ := res.RuleClasses("meter-1", "")
	if q.Shadow || len(classes) != 1 || !classes[0].Quota.Shadow {
		t.Fatalf("rule %v (classes %+v): want the rule enforced, its class in shadow mode", q, classes)
	}
	_, err = Parse(strings.NewReader(`limits: {default: {limit: 10, window: 1m, enforce: maybe}}`))
	if err == nil || !strings.Contains(err.Error(), "limits.default.enforce") {
		t.Fatalf("enforce: maybe: %v, want an error naming limits.default.enforce", err)
	}
}

// TestBlockConfig: block on a quota parses into devicelimit's terms; a
// block with 0 refusals, or without a span or a duration, is refused
// naming the key and the value.
func TestBlockConfig(t *testing.T) {
	c, err := Parse(strings.NewReader(`limits: {default: {limit: 10, window: 1m, block: {after: 1000, within: 1m, for: 10m}}}`))
	if err == nil {
		err = c.Validate()
	}
	if err != nil {
		t.Fatal(err)
	}
	if b := c.Limits.Default.Quota().Block; b != (devicelimit.Block{After: 1000, Within: time.Minute, For: 10 * time.Minute}) {
		t.Fatalf("block %+v", b)
	}
	for _, tc := range []struct{ yaml, want string }{
		{`limits: {default: {limit: 10, window: 1m, block: {after: 0, within: 1m, for: 10m}}}`, "limits.default.block.after: must be between 1 and 1000000000 refusals (got 0)"},
		{`limits: {default: {limit: 10, window: 1m, block: {after: 5, for: 10m}}}`, `limits.default.block.within: must be between 20ms and 720h0m0s (got "0s")`},
		{`limits: {default: {limit: 10, window: 1m, block: {after: 5, within: 1m}}}`, `limits.default.block.for: must be > 0 and at most 720h0m0s (got "0s")`},
		{`limits: {default: {limit: 10, window: 1m, block: {after: 5, within: 1m, for: 10m, forever: true}}}`, "forever"},
	} {
		c, err := Parse(strings.NewReader(tc.yaml))
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

// TestReservedClassName: a class may not be named "(override)", the
// metrics' label of the classes only overrides name.
func TestReservedClassName(t *testing.T) {
	c, err := Parse(strings.NewReader(`limits: {classes: [{name: "(override)", topics: ["a/#"], quota: {limit: 1, window: 1s}}]}`))
	if err == nil {
		err = c.Validate()
	}
	if want := `limits.classes[0].name: "(override)" is reserved`; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("%v, want %q", err, want)
	}
}
