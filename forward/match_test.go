package forward

import "testing"

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		filter, topic string
		want          bool
	}{
		{"devices/#", "devices/a/b", true},
		{"devices/#", "devices", true},
		{"devices/#", "other/a", false},
		{"devices/+/t", "devices/a/t", true},
		{"devices/+/t", "devices/a/b/t", false},
		{"devices/+", "devices/a", true},
		{"devices/+", "devices", false},
		{"#", "anything/at/all", true},
		{"#", "$SYS/x", false},
		{"+/x", "$SYS/x", false},
		{"a/b", "a/b", true},
		{"a/b", "a/b/c", false},
		{"a/b/c", "a/b", false},
		{"a//b", "a//b", true},
		{"+", "", true},
	} {
		if got := Match(c.filter, c.topic); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.filter, c.topic, got, c.want)
		}
	}
}
