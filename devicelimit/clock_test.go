package devicelimit

import (
	"testing"
	"testing/synctest"
	"time"
)

func TestSystemClockStartsAtHighWater(t *testing.T) {
	future := TickOf(time.Now().Add(time.Hour))
	c := NewSystemClock(future, 0)
	defer c.Close()
	if !c.RolledBack || c.Now() < future {
		t.Fatalf("clock started at %v (rolled back %v), want >= high-water %v", c.Now(), c.RolledBack, future)
	}
	past := TickOf(time.Now().Add(-time.Hour))
	c2 := NewSystemClock(past, 0)
	defer c2.Close()
	if c2.RolledBack || c2.Now() < TickOf(time.Now().Add(-time.Second)) {
		t.Fatalf("clock with an old high-water started at %v", c2.Now())
	}
}

func TestSystemClockAdvancesMonotonic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := NewSystemClock(0, time.Millisecond)
		start := c.Now()
		time.Sleep(50 * time.Millisecond) // fake time inside the bubble
		got := c.Now().Sub(start)
		if got < 45*time.Millisecond || got > 50*time.Millisecond {
			t.Errorf("clock advanced %v over 50ms of fake time", got)
		}
		if p := c.Precise(); p < c.Now() || p.Sub(start) != 50*time.Millisecond {
			t.Errorf("Precise = +%v, want +50ms", p.Sub(start))
		}
		c.Close()
		c.Close() // idempotent
	})
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
