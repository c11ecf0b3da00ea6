package broker

import (
	"runtime"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// seriesBytesBound is the most a device's series may take
// (docs/console.md gives the size measured).
const seriesBytesBound = 1024

// TestSeriesMemory measures the history's memory per tracked device:
// 100,000 devices' series, each with outcomes recorded, on the heap.
func TestSeriesMemory(t *testing.T) {
	const devices = 100_000
	now := devicelimit.TickOf(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	held := make([]*series, devices)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range held {
		s := newSeries()
		s.record(SeriesAdmitted, 40, now)
		s.record(SeriesRefused, 100, now.Add(time.Duration(i%3600)*time.Second))
		held[i] = s
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / devices
	t.Logf("history: %.0f bytes per tracked device, %.1f MiB at %d devices", per, per*devices/(1<<20), devices)
	if per > seriesBytesBound {
		t.Errorf("%.0f bytes per device, want at most %d", per, seriesBytesBound)
	}
	runtime.KeepAlive(held)
}

// TestSeriesSpans: outcomes land in their minute and hour, refusals at
// use 100, an admitted message at its window's use; History reads them
// back, the last slot holding now.
func TestSeriesSpans(t *testing.T) {
	t0 := devicelimit.TickOf(time.Date(2026, 3, 1, 12, 0, 30, 0, time.UTC))
	s := newSeries()
	s.record(SeriesAdmitted, useOf(&devicelimit.Decision{Allowed: true, Count: 3, Limit: 10}), t0)
	s.record(SeriesRefused, 100, t0.Add(2*time.Minute))
	s.record(SeriesDeferred, 100, t0.Add(2*time.Minute))
	start, ms := s.minutes.Read(int64(t0.Add(3 * time.Minute)))
	if got := devicelimit.Tick(start).Time().UTC().Format("15:04"); got != "11:04" {
		t.Fatalf("minutes start %s, want 11:04", got)
	}
	if ms[56] != [4]uint32{1, 0, 0, 30} || ms[58] != [4]uint32{0, 1, 1, 100} || ms[59] != [4]uint32{} {
		t.Fatalf("minutes: 12:00 %v, 12:02 %v, 12:03 %v", ms[56], ms[58], ms[59])
	}
	if a, u := s.recent(t0.Add(3 * time.Minute)); a != 1 || u != 100 {
		t.Fatalf("recent: %d admitted, use %d; want 1, 100", a, u)
	}
	_, hs := s.hours.Read(int64(t0))
	if hs[23] != [4]uint32{1, 1, 1, 100} {
		t.Fatalf("hour 12: %v", hs[23])
	}
}
