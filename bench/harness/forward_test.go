package main

import (
	"strings"
	"testing"
	"time"
)

// TestDrainGoalIsIssue41s: the goal table judges the drain as issue 41
// sets it, against build 0b30119 drained in the same run, and says
// why it does not judge without that baseline. Before, it printed the
// old goal, "≥ 50,000 msgs/s", whatever ran beside.
func TestDrainGoalIsIssue41s(t *testing.T) {
	d := drained{backlog: 1_000_000, drain: 20 * time.Second} // 50,000 msgs/s
	for _, c := range []struct {
		label string
		base  time.Duration // the baseline's drain of the same backlog
		want  string
	}{
		{"", 0, "| 50000 msgs/s (20s) | not judged: run with -baseline 0b30119 |"},
		{"0b30119", 25 * time.Second, "÷ 0b30119 (40000 msgs/s) 1.25 | met |"},
		{"0b30119", 23 * time.Second, "÷ 0b30119 (43478 msgs/s) 1.15 | not met |"},
		{"3c5f84a", 30 * time.Second, "÷ 3c5f84a 1.50 | not judged: the baseline is 3c5f84a, not 0b30119 |"},
	} {
		got := drainGoal(d, drained{backlog: d.backlog, drain: c.base}, c.label)
		if !strings.HasPrefix(got, "| drain of a 1000000-message backlog ≥ 1.2 × build 0b30119 in the same run |") || !strings.Contains(got, c.want) {
			t.Errorf("baseline %q: got %q, want it to contain %q", c.label, got, c.want)
		}
		if strings.Contains(got, "50,000") {
			t.Errorf("baseline %q: %q still names the old goal", c.label, got)
		}
	}
}
