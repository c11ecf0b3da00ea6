package admin

// GET /api/v1/devices/{id}/history and GET /api/v1/forward/history: a
// device's admitted, refused and deferred publishes and the peak use of
// its deciding window, and each forward destination's deliveries,
// backlog and dead letters, by minute over the last hour and by hour
// over the last day (docs/console.md).

import (
	"net/http"
	"sync"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/timeline"
)

// HistorySpan is counts in slots of Step from Start, oldest first, the
// last holding now; a value at Saturated may have been more. A device's
// slots hold admitted, refused, deferred and peak use percent; a
// destination's delivered, peak backlog and dead letters.
type HistorySpan struct {
	Step      time.Duration
	Start     devicelimit.Tick
	Slots     [][4]uint32
	Saturated uint32
}

// DeviceHistory is a device's outcomes by minute over the last hour,
// then by hour over the last day.
type DeviceHistory [2]HistorySpan

// SpanJSON is a device's HistorySpan in the API.
type SpanJSON struct {
	StepSeconds int      `json:"step_seconds"`
	Start       string   `json:"start"`
	Admitted    []uint32 `json:"admitted"`
	Refused     []uint32 `json:"refused"`
	Deferred    []uint32 `json:"deferred"`
	UsePercent  []uint32 `json:"use_percent"`
	// Saturated is the greatest count a slot holds: a count at it may
	// have been more.
	Saturated uint32 `json:"saturated"`
}

// DeviceHistoryJSON answers GET /api/v1/devices/{id}/history.
type DeviceHistoryJSON struct {
	Device string `json:"device"`
	// Tracked is false when the gateway keeps no history of the device
	// (not seen in the last 24 hours); Spans is then empty.
	Tracked bool       `json:"tracked"`
	Spans   []SpanJSON `json:"spans"`
}

// ForwardSpanJSON is a destination's HistorySpan in the API.
type ForwardSpanJSON struct {
	StepSeconds int    `json:"step_seconds"`
	Start       string `json:"start"`
	// Delivered counts messages the destination acknowledged in each
	// slot; Backlog is the greatest backlog sampled in it; Dead counts
	// messages moved to its dead letters.
	Delivered []uint32 `json:"delivered"`
	Backlog   []uint32 `json:"backlog"`
	Dead      []uint32 `json:"dead"`
}

// ForwardHistoryJSON is one destination in GET /api/v1/forward/history.
type ForwardHistoryJSON struct {
	Name  string            `json:"name"`
	Spans []ForwardSpanJSON `json:"spans"`
}

// ForwardHistoryListJSON answers GET /api/v1/forward/history.
type ForwardHistoryListJSON struct {
	// SampleSeconds is how often the destinations are sampled.
	SampleSeconds float64              `json:"sample_seconds"`
	Upstreams     []ForwardHistoryJSON `json:"upstreams"`
}

func spanSlots(sp HistorySpan, i int) []uint32 {
	out := make([]uint32, len(sp.Slots))
	for j, s := range sp.Slots {
		out[j] = s[i]
	}
	return out
}

func (s *Server) deviceHistory(w http.ResponseWriter, r *http.Request) {
	id, ok := deviceID(w, r)
	if !ok {
		return
	}
	out := DeviceHistoryJSON{Device: id, Spans: []SpanJSON{}}
	if s.opts.History != nil {
		if h, tracked := s.opts.History(id); tracked {
			out.Tracked = true
			for _, sp := range h {
				out.Spans = append(out.Spans, SpanJSON{StepSeconds: int(sp.Step / time.Second), Start: formatTick(sp.Start),
					Admitted: spanSlots(sp, 0), Refused: spanSlots(sp, 1), Deferred: spanSlots(sp, 2), UsePercent: spanSlots(sp, 3),
					Saturated: sp.Saturated})
			}
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// Destinations' values in their slots.
const (
	fwdDelivered = iota
	fwdBacklog
	fwdDead
)

// fwdSeries is one destination's history and the counters of its last
// sample.
type fwdSeries struct {
	minutes, hours  timeline.Ring[uint32]
	forwarded, dead uint64
}

// fwdHistory keeps every destination's history, sampled with the rates
// (RateInterval). Safe for concurrent use; the zero value is empty.
type fwdHistory struct {
	mu sync.Mutex
	by map[string]*fwdSeries
}

// tick samples stats at now.
func (f *fwdHistory) tick(now devicelimit.Tick, stats []ForwardStats) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.by == nil {
		f.by = map[string]*fwdSeries{}
	}
	at := int64(now)
	for _, st := range stats {
		var dead uint64
		for _, n := range st.DeadByReason {
			dead += n
		}
		fs := f.by[st.Upstream]
		if fs == nil {
			// The first sample sets the counters: deltas from the next.
			fs = &fwdSeries{minutes: timeline.New[uint32](time.Minute, 60), hours: timeline.New[uint32](time.Hour, 24),
				forwarded: st.Forwarded, dead: dead}
			f.by[st.Upstream] = fs
		}
		delivered, moved := uint32(min(sub(st.Forwarded, fs.forwarded), 1<<32-1)), uint32(min(sub(dead, fs.dead), 1<<32-1))
		backlog := uint32(min(max(st.Backlog, 0), 1<<32-1))
		for _, r := range []*timeline.Ring[uint32]{&fs.minutes, &fs.hours} {
			r.Add(at, fwdDelivered, delivered)
			r.Add(at, fwdDead, moved)
			r.Max(at, fwdBacklog, backlog)
		}
		fs.forwarded, fs.dead = st.Forwarded, dead
	}
}

// sub is a-b, 0 when a counter went back (a restart of its source).
func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

func (f *fwdHistory) list(now devicelimit.Tick, names []string) []ForwardHistoryJSON {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []ForwardHistoryJSON{}
	for _, name := range names {
		h := ForwardHistoryJSON{Name: name, Spans: []ForwardSpanJSON{}}
		if fs := f.by[name]; fs != nil {
			for _, r := range []*timeline.Ring[uint32]{&fs.minutes, &fs.hours} {
				start, slots := r.Read(int64(now))
				sp := HistorySpan{Step: r.Step(), Slots: slots}
				h.Spans = append(h.Spans, ForwardSpanJSON{StepSeconds: int(r.Step() / time.Second), Start: formatTick(devicelimit.Tick(start)),
					Delivered: spanSlots(sp, fwdDelivered), Backlog: spanSlots(sp, fwdBacklog), Dead: spanSlots(sp, fwdDead)})
			}
		}
		out = append(out, h)
	}
	return out
}

// forwardStats returns Options.Forward's stats, none without it.
func (s *Server) forwardStats() []ForwardStats {
	if s.opts.Forward == nil {
		return nil
	}
	return s.opts.Forward()
}

func (s *Server) forwardHistory(w http.ResponseWriter, _ *http.Request) {
	var names []string
	for _, st := range s.forwardStats() {
		names = append(names, st.Upstream)
	}
	writeJSON(w, http.StatusOK, ForwardHistoryListJSON{SampleSeconds: RateInterval.Seconds(), Upstreams: s.fwdHistory.list(s.opts.Clock.Now(), names)})
}
