package devicelimit

import (
	"testing"
	"time"
)

// TestMatchTopic: MQTT's matching rules (spec 4.7), with the cases the
// spec spells out.
func TestMatchTopic(t *testing.T) {
	for _, c := range []struct {
		filter, topic string
		want          bool
	}{
		{"devices/+/alarm/#", "devices/m1/alarm/fire", true},
		{"devices/+/alarm/#", "devices/m1/alarm", true},
		{"devices/+/alarm/#", "devices/m1/telemetry", false},
		{"devices/+/alarm/#", "devices/alarm", false},
		{"sport/tennis/player1/#", "sport/tennis/player1", true},
		{"sport/+", "sport", false},
		{"sport/+", "sport/", true},
		{"+/+", "/finance", true},
		{"/+", "/finance", true},
		{"+", "/finance", false},
		{"#", "anything/at/all", true},
		{"#", "$SYS/x", false},
		{"+/monitor", "$SYS/monitor", false},
		{"$SYS/#", "$SYS/monitor", true},
		{"a/b", "a/b", true},
		{"a/b", "a/b/c", false},
		{"a/b/c", "a/b", false},
		{"devices/#", "devices", true},
		{"devices/+/t", "devices/a/b/t", false},
		{"a//b", "a//b", true},
		{"+", "", true},
	} {
		if got := MatchTopic(c.filter, c.topic); got != c.want {
			t.Errorf("MatchTopic(%q, %q) = %v, want %v", c.filter, c.topic, got, c.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { MatchTopic("devices/+/alarm/#", "devices/m1/alarm/fire") }); n != 0 {
		t.Fatalf("MatchTopic allocated %v times", n)
	}
}

// TestClassBudgetApart: a device's alarms, in a class of their own, are
// admitted while its telemetry is refused, and the other way round;
// the first matching class judges.
func TestClassBudgetApart(t *testing.T) {
	tab := newTable(t, 10)
	device := Quota{Limit: 2, Window: time.Minute}
	classes := []Class{
		{Name: "alarms", Topics: []string{"devices/+/alarm/#"}, Quota: Quota{Limit: 1, Window: time.Minute}},
		{Name: "all-devices", Topics: []string{"devices/#"}, Quota: Quota{Limit: 3, Window: time.Minute}},
	}
	if err := ValidateClasses(classes, 10); err != nil {
		t.Fatal(err)
	}
	decide := func(topic string) bool {
		class, q := "", device
		if c, ok := MatchClass(classes, topic); ok {
			class, q = c.Name, c.Quota
		}
		return tab.AllowClassAt("meter", class, q, 10, t0).Allowed
	}
	for i, s := range []struct {
		topic string
		want  bool
	}{
		{"other/t", true}, {"other/t", true}, {"other/t", false}, // the device's 2
		{"devices/m/alarm/fire", true}, {"devices/m/alarm/smoke", false}, // alarms' 1
		{"devices/m/t", true}, {"devices/m/t", true}, {"devices/m/t", true}, {"devices/m/t", false}, // all-devices' 3
	} {
		if got := decide(s.topic); got != s.want {
			t.Fatalf("message %d on %s: allowed %v, want %v", i, s.topic, got, s.want)
		}
	}
	for _, bad := range [][]Class{
		{{Name: "", Topics: []string{"a"}, Quota: device}},
		{{Name: "a", Topics: []string{"a"}, Quota: device}, {Name: "a", Topics: []string{"b"}, Quota: device}},
		{{Name: "a", Quota: device}},
		{{Name: "a", Topics: []string{"a/#/b"}, Quota: device}},
		{{Name: "a", Topics: []string{"a"}, Quota: Quota{Limit: 0, Window: time.Second}}},
	} {
		if err := ValidateClasses(bad, 10); err == nil {
			t.Errorf("classes %+v accepted", bad)
		}
	}
}
