package devicelimit

import (
	"sync/atomic"
	"time"
)

// Tick is an instant on the logical clock, in nanoseconds since the Unix
// epoch. It follows the wall clock at start-up and is monotonic after.
type Tick int64

// TickOf returns the tick of a wall-clock time.
func TickOf(t time.Time) Tick { return Tick(t.UnixNano()) }

// Time returns the wall-clock time of the tick.
func (t Tick) Time() time.Time { return time.Unix(0, int64(t)) }

// Add returns t+d.
func (t Tick) Add(d time.Duration) Tick { return t + Tick(d) }

// Sub returns t-u.
func (t Tick) Sub(u Tick) time.Duration { return time.Duration(t - u) }

// String formats the tick as RFC 3339 with nanoseconds, in UTC.
func (t Tick) String() string { return t.Time().UTC().Format(time.RFC3339Nano) }

// Clock is the source of logical time. Implementations must be safe for
// concurrent use and must never go backwards.
type Clock interface {
	Now() Tick
}

// SystemClock is the gateway's logical clock. It starts at
// max(wall clock, high-water) and then advances with the monotonic clock,
// so a wall-clock step while the process runs changes nothing, and a wall
// clock set back while the gateway was down cannot empty a window.
//
// Now reads the monotonic clock every time. An earlier version cached a
// reading that a goroutine advanced every millisecond; on a loaded machine
// that goroutine ran late (248 ms behind was measured), and when it caught
// up, the instants of two decisions lay further apart than the real time
// between them, so a window could end early in real time. A monotonic
// read costs tens of nanoseconds and writes no shared memory, so readers
// on many cores do not contend. Use NewSystemClock. Safe for concurrent
// use.
type SystemClock struct {
	base Tick
	src  TimeSource
	mono time.Duration // src.Mono() at start
	// RolledBack is true when the wall clock was behind the high-water at
	// start-up, so the clock started at the high-water.
	RolledBack bool
	// Wall is the wall-clock time read at start-up.
	Wall Tick
}

// TimeSource is where a SystemClock reads time: the wall clock once, at
// start-up, and the monotonic clock after. RealTime is the system's.
type TimeSource interface {
	Wall() time.Time
	// Mono returns monotonic time since an arbitrary fixed origin. It
	// must never decrease.
	Mono() time.Duration
}

// RealTime reads the system's wall and monotonic clocks.
var RealTime TimeSource = realTime{}

var processStart = time.Now()

type realTime struct{}

func (realTime) Wall() time.Time     { return time.Now() }
func (realTime) Mono() time.Duration { return time.Since(processStart) }

// NewSystemClock starts a clock on RealTime at max(wall clock, highWater).
func NewSystemClock(highWater Tick) *SystemClock {
	return NewSystemClockOn(RealTime, highWater)
}

// NewSystemClockOn is NewSystemClock reading time from src.
func NewSystemClockOn(src TimeSource, highWater Tick) *SystemClock {
	mono := src.Mono()
	wall := TickOf(src.Wall())
	return &SystemClock{base: max(wall, highWater), src: src, mono: mono, RolledBack: wall < highWater, Wall: wall}
}

// Now returns the current logical time: the start plus the monotonic
// time elapsed since.
func (c *SystemClock) Now() Tick {
	if c.src == RealTime {
		return c.base.Add(time.Since(processStart) - c.mono) // no interface call
	}
	return c.base.Add(c.src.Mono() - c.mono)
}

// ManualClock is a Clock moved only by its owner, for tests and
// simulations. The zero value reads 0. Safe for concurrent use.
type ManualClock struct{ now atomic.Int64 }

// NewManualClock returns a clock reading start.
func NewManualClock(start Tick) *ManualClock {
	c := new(ManualClock)
	c.now.Store(int64(start))
	return c
}

// Now returns the clock's reading.
func (c *ManualClock) Now() Tick { return Tick(c.now.Load()) }

// Advance moves the clock forward by d and returns the new reading.
func (c *ManualClock) Advance(d time.Duration) Tick { return Tick(c.now.Add(int64(d))) }

// Set moves the clock to t, backwards too: the table treats a tick older
// than a window's newest bucket as that bucket.
func (c *ManualClock) Set(t Tick) { c.now.Store(int64(t)) }

// ManualTime is a TimeSource moved only by its owner, for tests and
// simulations of clock steps. Safe for concurrent use.
type ManualTime struct{ wall, mono atomic.Int64 }

// NewManualTime returns a source whose wall clock reads wall.
func NewManualTime(wall time.Time) *ManualTime {
	m := new(ManualTime)
	m.wall.Store(wall.UnixNano())
	return m
}

// Wall returns the wall-clock reading.
func (m *ManualTime) Wall() time.Time { return time.Unix(0, m.wall.Load()) }

// Mono returns the monotonic reading.
func (m *ManualTime) Mono() time.Duration { return time.Duration(m.mono.Load()) }

// Advance lets d pass: both clocks move forward.
func (m *ManualTime) Advance(d time.Duration) {
	m.mono.Add(int64(d))
	m.wall.Add(int64(d))
}

// StepWall moves only the wall clock, by d (negative to set it back), as
// NTP or an operator's `date` would.
func (m *ManualTime) StepWall(d time.Duration) { m.wall.Add(int64(d)) }
