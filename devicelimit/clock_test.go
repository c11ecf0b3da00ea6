package devicelimit

import (
	"testing"
	"testing/synctest"
	"time"
)

func TestSystemClockStartsAtHighWater(t *testing.T) {
	future := TickOf(time.Now().Add(time.Hour))
	c := NewSystemClock(future)
	if !c.RolledBack || c.Now() < future {
		t.Fatalf("clock started at %v (rolled back %v), want >= high-water %v", c.Now(), c.RolledBack, future)
	}
	past := TickOf(time.Now().Add(-time.Hour))
	c2 := NewSystemClock(past)
	if c2.RolledBack || c2.Now() < TickOf(time.Now().Add(-time.Second)) {
		t.Fatalf("clock with an old high-water started at %v", c2.Now())
	}
}

func TestSystemClockAdvancesMonotonic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := NewSystemClock(0)
		start := c.Now()
		time.Sleep(50 * time.Millisecond) // fake time inside the bubble
		if got := c.Now().Sub(start); got != 50*time.Millisecond {
			t.Errorf("clock advanced %v over 50ms of fake time", got)
		}
	})
}

// The clock is never behind the monotonic clock, however busy the
// machine: every reading is taken when Now is called. A clock that a
// background goroutine advanced lagged behind when that goroutine was
// starved, and two decisions' instants were then further apart than the
// real time between them.
func TestSystemClockKeepsUpUnderLoad(t *testing.T) {
	src := NewManualTime(t0.Time())
	c := NewSystemClockOn(src, 0)
	for i := range 1000 {
		src.Advance(time.Duration(i) * time.Microsecond)
		if got, want := c.Now(), t0.Add(src.Mono()); got != want {
			t.Fatalf("reading %d: clock at %v, want %v: it must follow every monotonic step at once", i, got, want)
		}
	}
}

func TestManualClock(t *testing.T) {
	c := NewManualClock(t0)
	if got := c.Advance(time.Second); got != t0.Add(time.Second) || c.Now() != got {
		t.Fatalf("Advance: %v", got)
	}
	c.Set(t0)
	if c.Now() != t0 {
		t.Fatal("Set")
	}
}
