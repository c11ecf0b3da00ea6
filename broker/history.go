package broker

// A device's refusal history, for the admin API's device listing and
// device page: how often and when it was last refused, and its latest
// refusals with their topic and reason. Kept in the device's devState,
// so it lives as long as the broker remembers the device (connected, or
// seen within lastSeenRetention).

import (
	"sync"
	"sync/atomic"

	"github.com/devicegate/devicegate/devicelimit"
)

// recentRefusals is how many refusals a device's history keeps.
const recentRefusals = 8

// Refusal is one refused publish of a device.
type Refusal struct {
	// At is the decision's instant on the clock of Options.Clock.
	At devicelimit.Tick
	// Topic is the refused message's topic.
	Topic string
	// Class is the topic class whose window refused it; "" for the
	// device's own quota.
	Class string
	// Reason says what refused it (refusal* constants).
	Reason string
}

// The reasons of a Refusal.
const (
	refusalWindow  = "quota exceeded"
	refusalGroup   = "group quota exceeded"
	refusalClosing = "sent after a policy disconnect"
	refusalWill    = "will over quota"
)

// history is a device's refusal count, latest refusal and ring of
// recent refusals. The counters are atomic; the ring has its own lock,
// taken only on a refusal and when the admin API reads it.
type history struct {
	refusals    atomic.Uint64
	lastRefused atomic.Int64

	mu     sync.Mutex
	ring   [recentRefusals]Refusal
	next   int // where the next refusal goes
	filled bool
}

// record adds a refusal; it allocates nothing.
func (h *history) record(r Refusal) {
	h.refusals.Add(1)
	for {
		cur := h.lastRefused.Load()
		if int64(r.At) <= cur || h.lastRefused.CompareAndSwap(cur, int64(r.At)) {
			break
		}
	}
	h.mu.Lock()
	h.ring[h.next] = r
	h.next = (h.next + 1) % recentRefusals
	if h.next == 0 {
		h.filled = true
	}
	h.mu.Unlock()
}

// recent returns the refusals kept, latest first.
func (h *history) recent() []Refusal {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.next
	if h.filled {
		n = recentRefusals
	}
	out := make([]Refusal, 0, n)
	for i := 1; i <= n; i++ {
		out = append(out, h.ring[(h.next-i+recentRefusals)%recentRefusals])
	}
	return out
}

// refused records a refusal of c's device at now: in Options.Throttled
// and in the device's history (when the broker tracks the device).
func (h *throttle) refused(c *connInfo, topic, class, reason string, now devicelimit.Tick) {
	if h.throttled != nil {
		h.throttled.Record(c.device, now)
	}
	if c.dev != nil {
		c.dev.history.record(Refusal{At: now, Topic: topic, Class: class, Reason: reason})
	}
	c.recordOutcome(SeriesRefused, 100, now)
}

// DeviceSummary is a line of the broker's device listing.
type DeviceSummary struct {
	Device string
	DeviceStatus
	// Refusals counts the device's refused publishes since the broker
	// began tracking it; LastRefused is the latest's instant, 0 for none.
	Refusals    uint64
	LastRefused devicelimit.Tick
	// Recent counts its messages admitted in the last 5 minutes; Use is
	// the peak percent of its deciding window in use then.
	Recent, Use uint32
}

// Devices returns every device the broker tracks now: connected, or seen
// within the last 24 hours; in no particular order. Deferred and
// BlockedUntil are filled in.
func (s *Server) Devices() []DeviceSummary {
	h := s.hook
	h.devMu.Lock()
	out := make([]DeviceSummary, 0, len(h.devices))
	series := make([]*series, 0, len(h.devices))
	for device, d := range h.devices {
		series = append(series, d.series)
		sum := DeviceSummary{Device: device, DeviceStatus: d.status(),
			Refusals: d.history.refusals.Load(), LastRefused: devicelimit.Tick(d.history.lastRefused.Load())}
		out = append(out, sum)
	}
	h.devMu.Unlock()
	now := s.opts.Clock.Now()
	for i := range out {
		if sr := series[i]; sr != nil {
			out[i].Recent, out[i].Use = sr.recent(now)
		}
		if s.def != nil {
			out[i].Deferred = s.def.queueLen(out[i].Device)
		}
		out[i].BlockedUntil, _ = s.hook.blocks.until(out[i].Device, now)
	}
	return out
}

// Refusals returns device's latest refusals, latest first (at most 8);
// nil when the broker does not track the device.
func (s *Server) Refusals(device string) []Refusal {
	h := s.hook
	h.devMu.Lock()
	d := h.devices[device]
	h.devMu.Unlock()
	if d == nil {
		return nil
	}
	return d.history.recent()
}
