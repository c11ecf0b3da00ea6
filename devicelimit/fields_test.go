package devicelimit

import (
	"testing"
	"time"
)

func TestAppendShortDuration(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{10 * time.Second, "10s"},
		{time.Minute, "1m"},
		{24 * time.Hour, "24h"},
		{90 * time.Minute, "1h30m"},
		{90 * time.Second, "1m30s"},
		{time.Hour + time.Second, "1h0m1s"},
		{1500 * ms, "1.5s"},
		{250 * ms, "250ms"},
		{1500 * time.Microsecond, "1.5ms"},
		{61*time.Minute + 500*ms, "1h1m0.5s"},
		{30 * 24 * time.Hour, "720h"},
	} {
		if got := string(AppendShortDuration(nil, c.d)); got != c.want {
			t.Errorf("%v: got %q, want %q", c.d, got, c.want)
		}
	}
}

func TestAppendPolicyWire(t *testing.T) {
	q := WithWindows(PolicyDrop,
		Limit{Messages, 100, 10 * time.Second}, Limit{Messages, 5000, 24 * time.Hour}, Limit{Bytes, 65536, 10 * time.Second})
	cs := []Class{{Name: "telemetry", Quota: Quota{Limit: 30, Window: time.Minute}}}
	gq := Quota{Limit: 1000, Window: time.Minute}
	got := string(AppendPolicy(nil, q, cs, &gq))
	want := `"10s";q=100;w=10, "24h";q=5000;w=86400, "10s-bytes";q=65536;w=10;qu="content-bytes", "telemetry/1m";q=30;w=60, "group/1m";q=1000;w=60`
	if got != want {
		t.Fatalf("\n got %s\nwant %s", got, want)
	}
	q = Quota{Limit: 100, Window: 10 * time.Second, Shadow: true}
	if got := string(AppendPolicy([]byte("x"), q, nil, nil)); got != `x"10s";q=100;w=10;shadow` {
		t.Fatalf("shadow, after what the buffer held: got %s", got)
	}
	// A window shorter than a second is w=1: w counts whole seconds, up.
	if got := string(AppendPolicy(nil, Quota{Limit: 5, Window: 250 * ms}, nil, nil)); got != `"250ms";q=5;w=1` {
		t.Fatalf("got %s", got)
	}
}

func TestPolicyNameEscapes(t *testing.T) {
	l := Limit{Messages, 1, time.Second}
	got := string(appendSFName(nil, `a"b\c%dé`, false, l))
	if want := `"a\"b\\c%25d%C3%A9/1s"`; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func TestFeedbackParse(t *testing.T) {
	for s, want := range map[string]Feedback{
		"off": {Mode: FeedbackOff}, "refusals": {Mode: FeedbackRefusals}, "always": {Mode: FeedbackAlways},
		"below 25%": {Mode: FeedbackBelow, Below: 25}, "below 100%": {Mode: FeedbackBelow, Below: 100},
	} {
		got, err := ParseFeedback(s)
		if err != nil || got != want || got.String() != s {
			t.Errorf("%q: got %+v, %v", s, got, err)
		}
	}
	for _, s := range []string{"", "sometimes", "below 0%", "below 101%", "below x"} {
		if _, err := ParseFeedback(s); err == nil {
			t.Errorf("%q: no error", s)
		}
	}
	if (Feedback{}).Effective() != DefaultFeedback {
		t.Fatal("the zero value is not the default")
	}
	q := Quota{Limit: 1, Window: time.Second, Feedback: Feedback{Mode: FeedbackAlways, Below: 5}}
	if err := q.Validate(10); err == nil {
		t.Fatal("a share for mode always: no error")
	}
	if err := ValidateClasses([]Class{{Name: "group", Topics: []string{"a"}, Quota: Quota{Limit: 1, Window: time.Second}}}, 10); err == nil {
		t.Fatal("a class named group: no error")
	}
}

func TestFeedbackWants(t *testing.T) {
	var s Standing
	s.Add(WindowStanding{Limit: Limit{N: 100}, Remaining: 30})
	for _, c := range []struct {
		f            Feedback
		refused      bool
		looks, wants bool
	}{
		{Feedback{Mode: FeedbackOff}, true, false, false},
		{Feedback{Mode: FeedbackRefusals}, false, false, false},
		{Feedback{Mode: FeedbackRefusals}, true, true, true},
		{Feedback{Mode: FeedbackAlways}, false, true, true},
		{Feedback{}, false, true, false}, // below 25 %: 30 % left
		{Feedback{Mode: FeedbackBelow, Below: 31}, false, true, true},
		{Feedback{}, true, true, true},
	} {
		if c.f.Looks(c.refused) != c.looks || c.f.Wants(c.refused, &s) != c.wants {
			t.Errorf("%v refused=%v: looks %v wants %v", c.f, c.refused, c.f.Looks(c.refused), c.f.Wants(c.refused, &s))
		}
	}
}
