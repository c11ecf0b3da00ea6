package config

import (
	"strings"
	"testing"

	"github.com/devicegate/devicegate/devicelimit"
)

func TestFeedbackKey(t *testing.T) {
	cfg, err := Parse(strings.NewReader(`
limits:
  default: {limit: 10, window: 1s, feedback: always}
  classes:
    - {name: alarms, topics: ["a/#"], quota: {limit: 1, window: 1s}}
  rules:
    - name: meters
      match: {client_id: "meter-*"}
      quota: {limit: 5, window: 1s, feedback: {below: 10%}}
      classes:
        - {name: t, topics: ["t/#"], quota: {limit: 1, window: 1s, feedback: "off"}}
        - {name: u, topics: ["u/#"], quota: {limit: 1, window: 1s}}
      group: {name: acme, quota: {limit: 100, window: 1m, feedback: refusals}}
    - name: others
      match: {client_id: "x-*"}
      quota: {limit: 5, window: 1s}
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	l := cfg.Limits
	for _, c := range []struct {
		what string
		got  *Feedback
		want devicelimit.Feedback
	}{
		{"default", l.Default.Feedback, devicelimit.Feedback{Mode: devicelimit.FeedbackAlways}},
		{"default's class", l.Classes[0].Quota.Feedback, devicelimit.Feedback{Mode: devicelimit.FeedbackAlways}},
		{"rule", l.Rules[0].Quota.Feedback, devicelimit.Feedback{Mode: devicelimit.FeedbackBelow, Below: 10}},
		{"class off", l.Rules[0].Classes[0].Quota.Feedback, devicelimit.Feedback{Mode: devicelimit.FeedbackOff}},
		{"class inheriting its rule's", l.Rules[0].Classes[1].Quota.Feedback, devicelimit.Feedback{Mode: devicelimit.FeedbackBelow, Below: 10}},
		{"group", l.Rules[0].Group.Quota.Feedback, devicelimit.Feedback{Mode: devicelimit.FeedbackRefusals}},
		{"rule inheriting the default's", l.Rules[1].Quota.Feedback, devicelimit.Feedback{Mode: devicelimit.FeedbackAlways}},
	} {
		if c.got == nil || c.got.Feedback != c.want {
			t.Errorf("%s: got %v, want %v", c.what, c.got, c.want)
		}
	}
	if got := l.Rules[0].Quota.Quota().Feedback; got != (devicelimit.Feedback{Mode: devicelimit.FeedbackBelow, Below: 10}) {
		t.Errorf("Quota(): %v", got)
	}
	// Written back as read.
	var out strings.Builder
	if err := cfg.Print(&out); err != nil {
		t.Fatal(err)
	}
	back, err := Parse(strings.NewReader(out.String()))
	if err != nil || back.Limits.Rules[0].Quota.Feedback.Feedback != l.Rules[0].Quota.Feedback.Feedback {
		t.Fatalf("round trip: %v\n%s", err, out.String())
	}
}

func TestFeedbackKeyRefused(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{`{limit: 1, window: 1s, feedback: sometimes}`, `limits.default.feedback: must be off, refusals, always or {below: N%} with N from 1 to 100 (got "sometimes")`},
		{`{limit: 1, window: 1s, feedback: {below: 0%}}`, `limits.default.feedback: must be off`},
		{`{limit: 1, window: 1s, feedback: {below: 101%}}`, `limits.default.feedback: must be off`},
		{`{limit: 1, window: 1s, feedback: {above: 5%}}`, `limits.default.feedback: must be off`},
		{`{limit: 1, window: 1s, feedback: true}`, `limits.default.feedback: must be off`},
	} {
		_, err := Parse(strings.NewReader("limits:\n  default: " + c.yaml + "\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.yaml, err, c.want)
		}
	}
	cfg, err := Parse(strings.NewReader("limits:\n  classes:\n    - {name: group, topics: [a], quota: {limit: 1, window: 1s}}\n"))
	if err == nil {
		err = cfg.Validate()
	}
	if err == nil || !strings.Contains(err.Error(), `limits.classes[0].name: "group" names the group's windows`) {
		t.Fatalf("a class named group: %v", err)
	}
}
