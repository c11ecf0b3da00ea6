package simulator

import (
	"slices"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// confirmed returns the largest number of w's units (messages or bytes)
// of l's admitted messages of topic class class ("" for the device's
// own quota) whose admission the device's own timestamps place, for
// certain, within less than w's length of each other, and the send time
// of the first of them.
//
// The gateway decides on a message after the device sent it and before
// the device has its ack and before the message reaches the subscriber:
// the decision lies in [sent, min(ack, arrival)]. A set of messages
// whose intervals all fit in a span shorter than T was admitted within
// less than T, however late the deliveries. The arrival-time window
// check (MaxInWindow) can be fooled by a subscriber that falls behind
// and then receives a backlog at once; this count cannot, at the price
// of missing excess when acks are slow. Messages that were deferred and
// released are left out: the device learns nothing of when they were
// released.
func confirmed(l DeviceLog, first map[uint64]time.Time, immediate time.Duration, deferPolicy bool, class string, w devicelimit.Limit) (int, time.Time) {
	type span struct {
		lo, hi time.Time
		units  int
	}
	var spans []span
	for _, s := range l.Sent {
		at, arrived := first[s.Seq]
		if s.Class != class || !arrived || s.Ack == AckRefused || deferPolicy && at.Sub(s.At) > immediate {
			continue
		}
		hi := at
		if !s.AckAt.IsZero() && s.AckAt.Before(hi) {
			hi = s.AckAt
		}
		spans = append(spans, span{s.At, hi, w.Units(s.Size)})
	}
	slices.SortFunc(spans, func(a, b span) int { return a.lo.Compare(b.lo) })
	// For each i (a window starting at spans[i].lo), count the j in
	// [i, r) (lo before the window's end) whose hi is before the end
	// too. Ends grow with i, so the spans whose hi is before the end
	// are added to a Fenwick tree over positions as i advances: n log n.
	byHi := make([]int, len(spans))
	for i := range byHi {
		byHi[i] = i
	}
	slices.SortFunc(byHi, func(a, b int) int { return spans[a].hi.Compare(spans[b].hi) })
	tree := make([]int, len(spans)+1)
	add := func(i, v int) {
		for i++; i < len(tree); i += i & -i {
			tree[i] += v
		}
	}
	sum := func(i int) (n int) { // over positions [0, i)
		for ; i > 0; i -= i & -i {
			n += tree[i]
		}
		return n
	}
	best, start, r, p := 0, time.Time{}, 0, 0
	for i, a := range spans {
		end := a.lo.Add(w.Window)
		for r < len(spans) && spans[r].lo.Before(end) {
			r++
		}
		for p < len(byHi) && spans[byHi[p]].hi.Before(end) {
			add(byHi[p], spans[byHi[p]].units)
			p++
		}
		if n := sum(r) - sum(i); n > best || i == 0 && best == 0 {
			best, start = n, a.lo
		}
	}
	return best, start
}
