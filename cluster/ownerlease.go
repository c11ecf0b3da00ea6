package cluster

import (
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// recentSlots is the number of slots a recent count splits its span in;
// it holds one more, so that the slots held always reach a whole span
// back.
const recentSlots = 16

// recent counts what a device admitted since its last durable
// checkpoint, over the last span (its longest quota window of a unit):
// what a new owner reading that checkpoint cannot know of, in any window
// reaching the instant it settles (docs/design.md, "Decisions where the
// device is"). Older admissions are in the checkpoint's windows or out
// of every window: they need no lease. Counts are kept in slots of
// ceil(span/recentSlots), rounded outward: a count is dropped only once
// its whole slot is a span old, so the sum never misses an admission of
// the last span. The zero value is empty.
type recent struct {
	slot  time.Duration // a slot's length; 0 until the first add
	head  int64         // the newest slot's number (instant / slot)
	total int64         // the sum of n
	n     [recentSlots + 1]int64
}

// slotOf returns the slot length of span.
func slotOf(span time.Duration) time.Duration {
	return max((span+recentSlots-1)/recentSlots, 1)
}

// respanned reports whether r counted over another span than span: a
// longer span needs counts r has already let go of, so the owner voids
// the lease then (a checkpoint lands before the next admission).
func (r *recent) respanned(span time.Duration) bool {
	return r.slot != 0 && r.slot != slotOf(span)
}

// advance moves r to now (span the window it covers): slots that left
// it are emptied. A new span re-slots r with everything it held in the
// newest slot (kept longer, never shorter). An instant before the head
// counts in the head.
func (r *recent) advance(now devicelimit.Tick, span time.Duration) {
	slot := slotOf(span)
	idx := max(int64(now)/int64(slot), 0)
	if slot != r.slot {
		r.n = [recentSlots + 1]int64{}
		r.slot, r.head = slot, idx
		r.n[r.pos(idx)] = r.total
		return
	}
	if idx <= r.head {
		return
	}
	if idx-r.head >= int64(len(r.n)) || r.total == 0 {
		r.n, r.total = [recentSlots + 1]int64{}, 0
	} else {
		for j := r.head + 1; j <= idx; j++ {
			p := r.pos(j)
			r.total -= r.n[p]
			r.n[p] = 0
		}
	}
	r.head = idx
}

func (r *recent) pos(j int64) int { return int(j % int64(len(r.n))) }

// sum returns the count over the last span at now.
func (r *recent) sum(now devicelimit.Tick, span time.Duration) int64 {
	r.advance(now, span)
	return r.total
}

// add counts v at now.
func (r *recent) add(now devicelimit.Tick, span time.Duration, v int64) {
	r.advance(now, span)
	r.n[r.pos(r.head)] += v
	r.total += v
}

// drop takes out of r what the copy old held (a checkpoint taken with
// old is durable: those admissions are in it). Slots r no longer holds
// are gone already; with another slot length nothing is taken
// (counting on is the safe side).
func (r *recent) drop(old *recent) {
	if old.slot != r.slot {
		return
	}
	for j := max(old.head, r.head, int64(len(r.n))-1) - int64(len(r.n)) + 1; j <= min(old.head, r.head); j++ {
		p := r.pos(j)
		d := min(r.n[p], old.n[p])
		r.n[p] -= d
		r.total -= d
	}
}

// span returns the longest quota window of unit u in d (d.mu held),
// 0 when it has none.
func (d *owned) span(u devicelimit.Unit) time.Duration {
	var s time.Duration
	for _, w := range d.wins {
		if w.unit == u && w.quota() {
			s = max(s, w.length)
		}
	}
	return s
}

// since returns r's count over span at now with n more (d.mu held): 0
// when span is 0 (no window of the unit: its lease is infinite; r is
// emptied). A span other than r's voids d's lease: r let go of counts a
// longer span needs, so a checkpoint must land before the next
// admission.
func (d *owned) since(r *recent, now devicelimit.Tick, span time.Duration, n int64) int64 {
	if span == 0 {
		if r.slot != 0 {
			*r = recent{}
		}
		return 0
	}
	if r.respanned(span) {
		d.leasedM, d.leasedB = 0, 0
	}
	return r.sum(now, span) + n
}
