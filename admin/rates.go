package admin

// GET /api/v1/rates: publishes admitted, refused, deferred and
// would-refuse per second over the last 15 minutes, sampled from
// Options.Stats every RateInterval, and the gauges of the console's
// overview now.

import (
	"net/http"
	"sync"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// RateInterval is how often Options.Stats is sampled; RateSpan is how
// far back the samples go.
const (
	RateInterval = 5 * time.Second
	RateSpan     = 15 * time.Minute
)

// rateCounters are the counters a rate is taken of.
type rateCounters struct {
	admitted, refused, deferred, wouldRefuse uint64
}

func countersOf(s Snapshot) rateCounters {
	return rateCounters{admitted: s.Allowed, refused: s.Dropped + s.Disconnected + s.Overflowed, deferred: s.Deferred, wouldRefuse: s.WouldRefuse}
}

// RateJSON is the rates of one interval, per second, ending At.
type RateJSON struct {
	At          string  `json:"at"`
	Admitted    float64 `json:"admitted"`
	Refused     float64 `json:"refused"`
	Deferred    float64 `json:"deferred"`
	WouldRefuse float64 `json:"would_refuse"`
}

// RatesJSON answers GET /api/v1/rates.
type RatesJSON struct {
	IntervalSeconds float64 `json:"interval_seconds"`
	// Samples are oldest first; the last is the latest interval's.
	Samples          []RateJSON `json:"samples"`
	Connected        int64      `json:"connected"`
	Blocked          int        `json:"blocked"`
	DevicesTracked   int        `json:"devices_tracked"`
	DeferredMessages int64      `json:"deferred_messages"`
	// DeferredDamaged is how many deferred messages the data file holds
	// set aside as damaged, never released.
	DeferredDamaged int64 `json:"deferred_damaged"`
	PersistFailing  bool  `json:"persist_failing"`
}

// rateRing keeps the rates of the last RateSpan. Safe for concurrent
// use; the zero value is empty.
type rateRing struct {
	mu      sync.Mutex
	last    rateCounters
	lastAt  devicelimit.Tick
	have    bool
	samples []RateJSON // oldest first, at most RateSpan/RateInterval
}

// tick takes the counters c read at now: the rates since the previous
// tick become a sample.
func (r *rateRing) tick(now devicelimit.Tick, c rateCounters) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.have && now > r.lastAt {
		secs := now.Sub(r.lastAt).Seconds()
		rate := func(cur, prev uint64) float64 {
			if cur < prev {
				return 0
			}
			return float64(cur-prev) / secs
		}
		if len(r.samples) == int(RateSpan/RateInterval) {
			r.samples = append(r.samples[:0], r.samples[1:]...)
		}
		r.samples = append(r.samples, RateJSON{At: formatTick(now), Admitted: rate(c.admitted, r.last.admitted),
			Refused: rate(c.refused, r.last.refused), Deferred: rate(c.deferred, r.last.deferred), WouldRefuse: rate(c.wouldRefuse, r.last.wouldRefuse)})
	}
	r.last, r.lastAt, r.have = c, now, true
}

func (r *rateRing) list() []RateJSON {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]RateJSON{}, r.samples...)
}

// sampleRates samples Options.Stats every RateInterval until stop closes.
func (s *Server) sampleRates(stop <-chan struct{}) {
	t := time.NewTicker(RateInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			s.rateTick()
		}
	}
}

func (s *Server) rateTick() {
	now := s.opts.Clock.Now()
	s.rateRing.tick(now, countersOf(s.opts.Stats.MetricsSnapshot()))
	s.fwdHistory.tick(now, s.forwardStats())
}

func (s *Server) rates(w http.ResponseWriter, _ *http.Request) {
	out := RatesJSON{IntervalSeconds: RateInterval.Seconds(), Samples: s.rateRing.list()}
	if s.opts.Stats != nil {
		st := s.opts.Stats.MetricsSnapshot()
		out.Connected, out.Blocked, out.DevicesTracked = st.ConnectedClients, st.Blocked, st.DevicesTracked
		out.DeferredMessages, out.PersistFailing = st.QueueMessages, st.PersistFailing
		out.DeferredDamaged = st.DeferredDamaged
	}
	writeJSON(w, http.StatusOK, out)
}
