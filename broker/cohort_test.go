package broker

import (
	"testing"
	"time"
)

// TestCohortOffsets: a batch's connections wait, after its commit, as
// long after its first ask as they asked, at most maxCohortSpacing; a
// later batch starts afresh, and one older than the latest waits
// nothing more.
func TestCohortOffsets(t *testing.T) {
	var c cohorts
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, s := range []struct {
		gen  uint32
		at   time.Duration
		want time.Duration
	}{
		{7, 0, 0}, // the first ask of batch 7
		{7, 2 * time.Millisecond, 2 * time.Millisecond},
		{7, 5 * time.Millisecond, 5 * time.Millisecond},
		{7, time.Second, maxCohortSpacing}, // a slow commit's batch: bounded
		{8, 6 * time.Millisecond, 0},       // batch 8's first ask
		{7, 7 * time.Millisecond, 0},       // batch 7, late: its first ask is gone
		{8, 9 * time.Millisecond, 3 * time.Millisecond},
		{8, 4 * time.Millisecond, 0},          // a clock read before the first: never negative
		{1<<32 - 1, 10 * time.Millisecond, 0}, // older, across the wrap of the batch numbers
		{8, 10 * time.Millisecond, 4 * time.Millisecond},
	} {
		if got := c.offset(s.gen, t0.Add(s.at)); got != s.want {
			t.Fatalf("batch %d asked at +%v: spacing %v, want %v", s.gen, s.at, got, s.want)
		}
	}
}
