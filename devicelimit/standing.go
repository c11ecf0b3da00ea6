package devicelimit

import "time"

// A device's standing: where each window that bounds a message stands
// at an instant, what the gateway tells a device on its
// acknowledgements (docs/device-feedback.md). For each window: r, how
// many more messages (bytes, in a byte window) it admits now, and t,
// how long until it next frees room: the retry-after of a message it
// refuses, else until its oldest counted bucket expires (0 when it
// holds nothing). Counts only expire while nothing is admitted, so r is
// a promise: the next r messages (bytes) the device alone sends are
// admitted, whenever they come.

// WindowStanding is one window's standing.
type WindowStanding struct {
	// Class is the topic class whose window it is; "" for the device's
	// own quota or its group's.
	Class string
	// Group reports a window of the device's group.
	Group bool
	// Shadow reports a window of a quota in shadow mode: r and t are
	// what the quota would leave if it were enforced.
	Shadow bool
	// Limit is the window: unit, N and length.
	Limit Limit
	// Remaining is r: how many more messages (bytes) the window admits
	// now, 0 when full.
	Remaining int
	// Reset is t: the retry-after of a message the window refuses,
	// else how long until its oldest count expires; 0 for an empty
	// window.
	Reset time.Duration
}

// MaxStanding is the most windows that bound one message: its quota's
// and its group's.
const MaxStanding = 2 * MaxWindows

// Standing is the standing of the windows that bound one message, in
// Windows[:N]. A value of fixed size: filling one allocates nothing.
// The zero value holds no window.
type Standing struct {
	Windows [MaxStanding]WindowStanding
	N       int
}

// Add appends w, dropping it when s is full.
func (s *Standing) Add(w WindowStanding) {
	if s.N < len(s.Windows) {
		s.Windows[s.N] = w
		s.N++
	}
}

// Sort orders s's windows tightest first: the lowest share left, r/q,
// first; windows as tight keep their order.
func (s *Standing) Sort() {
	w := s.Windows[:s.N]
	for i := 1; i < len(w); i++ {
		for j := i; j > 0 && tighter(w[j], w[j-1]); j-- {
			w[j], w[j-1] = w[j-1], w[j]
		}
	}
}

// tighter reports whether a has less of its window left than b:
// a.r/a.q < b.r/b.q, compared exactly.
func tighter(a, b WindowStanding) bool {
	return int64(a.Remaining)*int64(b.Limit.N) < int64(b.Remaining)*int64(a.Limit.N)
}

// Below reports whether some window has less than percent % of its
// quota left: r/q < percent/100.
func (s *Standing) Below(percent int) bool {
	for _, w := range s.Windows[:s.N] {
		if int64(w.Remaining)*100 < int64(percent)*int64(w.Limit.N) {
			return true
		}
	}
	return false
}

// StandingAt fills s with the standing at now of the windows that bound
// a message of size bytes of device in topic class ("" for its own
// quota) under q, and, when groupKey is not "", of its group's windows
// under gq; refused says the message was refused (or would have been,
// in shadow mode), so a window too full for it gets its retry-after as
// t. The windows come tightest first (Sort). It changes nothing and
// allocates nothing (after the shard's first look, PeekAt's).
func (t *Table) StandingAt(device, class string, q Quota, groupKey string, gq Quota, size int, refused bool, now Tick, s *Standing) {
	s.N = 0
	var one [1]Limit
	t.standingOf(device, class, limitsInto(q, &one), size, refused, now, WindowStanding{Class: class, Shadow: q.Shadow}, s)
	if groupKey != "" {
		t.standingOf(groupKey, "", limitsInto(gq, &one), size, refused, now, WindowStanding{Group: true, Shadow: gq.Shadow}, s)
	}
	s.Sort()
}

// standingOf appends to s the standing of stem's windows ls of class,
// each a copy of proto with its window and state.
func (t *Table) standingOf(stem, class string, ls []Limit, size int, refused bool, now Tick, proto WindowStanding, s *Standing) {
	if t.invalidLimit(ls) != -1 {
		return
	}
	sh, _ := t.shard(stem)
	sh.mu.Lock()
	var seen [2]int
	for _, l := range ls {
		key := sh.windowKey(stem, class, l.Unit, seen[l.Unit])
		seen[l.Unit]++
		w := proto
		w.Limit = l
		w.Remaining, w.Reset = sh.standing(key, l, l.Units(size), refused, now)
		s.Add(w)
	}
	sh.mu.Unlock()
}

// standing returns r and t of the window under key (s.mu held) for a
// message counting n, decided on a copy of the window (a read changes
// nothing).
func (s *shard) standing(key string, l Limit, n int, refused bool, now Tick) (int, time.Duration) {
	r, ok := s.peekCopy(key, hashString(key), l.N)
	if !ok {
		return l.N, 0
	}
	tooLarge := n > l.N // no retry admits it: say when room frees
	if tooLarge || !refused {
		n = 1
	}
	d := r.decideN(l, now, &s.cut, n, false)
	left := max(l.N-d.Count, 0)
	if refused && !tooLarge && d.RetryAfter > 0 {
		return left, d.RetryAfter
	}
	return left, r.nextFree(&s.cut, l.Window, now)
}

// nextFree returns how long until the oldest count of r, advanced to
// now, expires: 0 when r holds none.
func (r rec) nextFree(c *cut, window time.Duration, now Tick) time.Duration {
	total := r.total()
	if total == 0 {
		return 0
	}
	slots := c.buckets + 1
	nb := r.head()
	k := nb - int64(c.buckets) + int64(r.slotsToAdmit(int(nb%int64(slots)), slots, 0, total))
	return max(c.bucketStart(k+int64(slots), window).Sub(now), 0)
}
