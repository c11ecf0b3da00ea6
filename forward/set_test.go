package forward

import (
	"testing"
	"time"
)

// TestStatsAddRetryIn: an upstream's next attempt is the soonest of its
// waiting connections'; a connection that is up or trying (0) does not
// hide one that waits.
func TestStatsAddRetryIn(t *testing.T) {
	for _, c := range []struct{ a, b, want time.Duration }{
		{0, 0, 0},
		{0, 3 * time.Second, 3 * time.Second},
		{2 * time.Second, 0, 2 * time.Second},
		{2 * time.Second, 3 * time.Second, 2 * time.Second},
		{5 * time.Second, time.Second, time.Second},
	} {
		if got := (Stats{RetryIn: c.a}).add(Stats{RetryIn: c.b}).RetryIn; got != c.want {
			t.Errorf("%s with %s: %s, want %s", c.a, c.b, got, c.want)
		}
	}
}
