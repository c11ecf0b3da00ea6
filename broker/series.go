package broker

// A device's outcomes over time, for the admin API's device history
// (GET /api/v1/devices/{id}/history): its admitted, refused and
// deferred publishes and the peak use of its windows, by minute over
// the last hour and by hour over the last day, in fixed memory per
// device (internal/timeline; docs/console.md gives the size measured).
// Kept in the device's devState, so it lives as long as the broker
// remembers the device.

import (
	"sync"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/timeline"
)

// The values of a series' slots.
const (
	SeriesAdmitted = iota
	SeriesRefused
	SeriesDeferred
	SeriesUse // the peak share of the deciding window in use, percent
)

// The series' spans: 60 minutes, 24 hours.
const (
	seriesMinutes = 60
	seriesHours   = 24
)

// series is a device's outcomes by minute and by hour. Safe for
// concurrent use (a device may have several connections).
type series struct {
	mu      sync.Mutex
	minutes timeline.Ring[uint16]
	hours   timeline.Ring[uint32]
}

func newSeries() *series {
	return &series{minutes: timeline.New[uint16](time.Minute, seriesMinutes), hours: timeline.New[uint32](time.Hour, seriesHours)}
}

// record counts an outcome (SeriesAdmitted, SeriesRefused,
// SeriesDeferred) at now, its deciding window use percent in use; it
// allocates nothing.
func (s *series) record(kind int, use uint32, now devicelimit.Tick) {
	at := int64(now)
	s.mu.Lock()
	s.minutes.AddMax(at, kind, 1, SeriesUse, use)
	s.hours.AddMax(at, kind, 1, SeriesUse, use)
	s.mu.Unlock()
}

// recentSlots is how many minutes DeviceSummary's Recent and Use
// cover.
const recentSlots = 5

// recent returns the admitted messages and the peak use of the last
// recentSlots minutes.
func (s *series) recent(now devicelimit.Tick) (admitted, use uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.minutes.Sum(int64(now), recentSlots, SeriesAdmitted), s.minutes.Peak(int64(now), recentSlots, SeriesUse)
}

// useOf is the percent of an admitting decision's window in use,
// rounded up.
func useOf(d *devicelimit.Decision) uint32 {
	if d.Limit <= 0 {
		return 0
	}
	return uint32(min(100, (d.Count*100+d.Limit-1)/d.Limit))
}

// Span is a device's outcomes in slots of Step from Start, oldest
// first, the last holding now; a value at Saturated may have been more.
type Span struct {
	Step      time.Duration
	Start     devicelimit.Tick
	Slots     [][4]uint32 // indexed by SeriesAdmitted...SeriesUse
	Saturated uint32
}

// History returns device's outcomes by minute over the last hour and by
// hour over the last day; false when the broker does not track it.
func (s *Server) History(device string) ([2]Span, bool) {
	h := s.hook
	h.devMu.Lock()
	d := h.devices[device]
	h.devMu.Unlock()
	if d == nil || d.series == nil {
		return [2]Span{}, false
	}
	now := int64(s.opts.Clock.Now())
	d.series.mu.Lock()
	defer d.series.mu.Unlock()
	m0, ms := d.series.minutes.Read(now)
	h0, hs := d.series.hours.Read(now)
	return [2]Span{
		{Step: time.Minute, Start: devicelimit.Tick(m0), Slots: ms, Saturated: timeline.Saturated[uint16]()},
		{Step: time.Hour, Start: devicelimit.Tick(h0), Slots: hs, Saturated: timeline.Saturated[uint32]()},
	}, true
}

// recordOutcome counts an outcome of c's device in its series, use
// percent of its window in use.
func (c *connInfo) recordOutcome(kind int, use uint32, now devicelimit.Tick) {
	if c.dev != nil && c.dev.series != nil {
		c.dev.series.record(kind, use, now)
	}
}
