// Package topk finds the devices refused most often lately, in bounded
// memory: the summary behind the admin API's GET /api/v1/throttled.
package topk

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// Generations is how many periods a Tracker remembers: the current one
// and the one before. A refusal stops counting once its period is more
// than Generations-1 periods in the past.
const Generations = 2

// Entry is one device of a Tracker summary.
type Entry struct {
	Device string
	// Refused is the device's refusals in the generations still
	// counted. It is exact while the summary has tracked fewer than k
	// devices; after that it may overestimate (never underestimate) by
	// the count the device inherited when it replaced the least-refused
	// entry (Space-Saving).
	Refused uint64
}

// Tracker finds the devices refused most in the last few periods in bounded
// memory: a Space-Saving summary (Metwally, Agrawal, El Abbadi 2005) of k
// counters, each split into Generations generations that rotate every
// period. The counts always sum to N, the refusals in the generations
// counted. Within one period, Space-Saving's guarantee holds: any device
// refused more than N/k times is in the summary, with a count no lower
// than its true one. Across a rotation it holds approximately: an entry
// taken over inherits the previous device's per-generation counts, so
// the split between generations is approximate and the older part
// decays with the entry rather than with the device.
//
// Build it with New; the zero value is not usable. Safe for
// concurrent use.
type Tracker struct {
	period time.Duration
	k      int

	mu      sync.Mutex
	gen     int64 // the generation (now/period) counts[0] belongs to
	entries []entry
	index   map[string]int // device -> position in entries
}

type entry struct {
	device string
	// counts[0] is the current generation, counts[i] the one i periods
	// before.
	counts [Generations]uint64
}

func (e *entry) total() uint64 {
	var n uint64
	for _, c := range e.counts {
		n += c
	}
	return n
}

// New returns a summary of k counters whose generations rotate every
// period. It panics if k < 1 or period <= 0.
func New(k int, period time.Duration) *Tracker {
	if k < 1 {
		panic("topk: New: k must be >= 1")
	}
	if period <= 0 {
		panic("topk: New: period must be > 0")
	}
	return &Tracker{
		period:  period,
		k:       k,
		entries: make([]entry, 0, k),
		index:   make(map[string]int, k),
	}
}

// K returns the number of counters.
func (t *Tracker) K() int { return t.k }

// Record counts one refusal of device at now. device is kept as given,
// not copied. Once device is tracked, Record allocates nothing.
func (t *Tracker) Record(device string, now devicelimit.Tick) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rotate(now)
	if i, ok := t.index[device]; ok {
		t.entries[i].counts[0]++
		return
	}
	if len(t.entries) < cap(t.entries) {
		t.entries = append(t.entries, entry{device: device})
		t.entries[len(t.entries)-1].counts[0] = 1
		t.index[device] = len(t.entries) - 1
		return
	}
	// Space-Saving: the new device takes over the least-refused entry
	// and its counts, an upper bound of what it may have had before.
	m, least := 0, t.entries[0].total()
	for i := 1; i < len(t.entries); i++ {
		if n := t.entries[i].total(); n < least {
			m, least = i, n
		}
	}
	e := &t.entries[m]
	delete(t.index, e.device)
	e.device = device
	e.counts[0]++
	t.index[device] = m
}

// rotate moves the generations forward to now's period and forgets the
// entries left with no count. Called with mu held.
func (t *Tracker) rotate(now devicelimit.Tick) {
	gen := int64(now) / int64(t.period)
	if gen <= t.gen {
		return // same period, or a clock read before the latest (kept in the current generation)
	}
	shift := gen - t.gen
	t.gen = gen
	if shift >= Generations {
		clear(t.index)
		clear(t.entries)
		t.entries = t.entries[:0]
		return
	}
	kept := t.entries[:0]
	for _, e := range t.entries {
		copy(e.counts[shift:], e.counts[:Generations-shift])
		clear(e.counts[:shift])
		if e.total() == 0 {
			delete(t.index, e.device)
			continue
		}
		t.index[e.device] = len(kept)
		kept = append(kept, e)
	}
	clear(t.entries[len(kept):])
	t.entries = kept
}

// Top returns the n devices refused most in the generations counted at
// now, by Refused descending then device ascending; all tracked devices
// when n <= 0 or n exceeds them.
func (t *Tracker) Top(n int, now devicelimit.Tick) []Entry {
	t.mu.Lock()
	t.rotate(now)
	out := make([]Entry, 0, len(t.entries))
	for i := range t.entries {
		out = append(out, Entry{Device: t.entries[i].device, Refused: t.entries[i].total()})
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b Entry) int {
		if c := cmp.Compare(b.Refused, a.Refused); c != 0 {
			return c
		}
		return cmp.Compare(a.Device, b.Device)
	})
	if n > 0 && n < len(out) {
		out = out[:n]
	}
	return out
}

// Len returns the number of devices tracked at now, at most k.
func (t *Tracker) Len(now devicelimit.Tick) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rotate(now)
	return len(t.entries)
}
