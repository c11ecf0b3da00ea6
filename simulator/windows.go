package simulator

import (
	"slices"
	"sort"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// WindowResult is the checker's verdict on one window of a device: of
// its own quota (Class "") or of a topic class, counting messages or
// payload bytes. A quota of one message window has one, the same as
// the DeviceResult's own fields.
type WindowResult struct {
	Class    string        `json:"class,omitempty"`
	Unit     string        `json:"unit"` // messages or bytes
	Limit    int           `json:"limit"`
	WindowNS time.Duration `json:"window_ns"`
	// MaxInWindow is the largest number of messages (or bytes) among
	// first arrivals in any half-open window of WindowNS - Tolerance;
	// Confirmed the largest the device's send and ack times place
	// within less than WindowNS (see confirmed). Excess and
	// ConfirmedExcess are what they hold above Limit.
	MaxInWindow     int       `json:"max_in_window"`
	MaxWindowStart  time.Time `json:"max_window_start,omitzero"`
	Excess          int       `json:"excess"`
	Confirmed       int       `json:"confirmed"`
	ConfirmedExcess int       `json:"confirmed_excess"`
	ConfirmedStart  time.Time `json:"confirmed_start,omitzero"`
	// Allowance is the device's crash allowance in this window's unit:
	// messages, or messages times the largest payload it sent.
	Allowance int `json:"allowance,omitempty"`
}

// violation is DeviceResult.Violation for this window.
func (w WindowResult) violation(released bool) bool {
	return w.Excess > w.Allowance && (w.ConfirmedExcess > w.Allowance || released)
}

// judgeWindows judges every window of the device's own quota and of its
// topic classes (in name order) on its first arrivals. An arrival of a
// sequence number never sent counts in the device's own windows, as
// an empty message.
func judgeWindows(l DeviceLog, first map[uint64]time.Time, opts CheckOptions, deferPolicy, released bool) []WindowResult {
	type msg struct {
		class string
		size  int
	}
	bySeq := make(map[uint64]msg, len(l.Sent))
	largest := map[string]int{}
	for _, s := range l.Sent {
		bySeq[s.Seq] = msg{s.Class, s.Size}
		largest[s.Class] = max(largest[s.Class], s.Size)
	}
	classes := []string{""}
	for name := range l.Classes {
		classes = append(classes, name)
	}
	sort.Strings(classes[1:])
	var out []WindowResult
	for _, class := range classes {
		q := l.Quota
		if class != "" {
			q = l.Classes[class]
		}
		var arrived []point
		for seq, at := range first {
			m := bySeq[seq]
			if m.class == class {
				arrived = append(arrived, point{at: at, size: m.size})
			}
		}
		slices.SortFunc(arrived, func(a, b point) int { return a.at.Compare(b.at) })
		for _, w := range q.Limits() {
			r := WindowResult{Class: class, Unit: w.Unit.String(), Limit: w.N, WindowNS: w.Window, Allowance: l.Allowance}
			if w.Unit == devicelimit.Bytes {
				r.Allowance = l.Allowance * largest[class]
			}
			r.MaxInWindow, r.MaxWindowStart = maxInWindow(arrived, w, w.Window-opts.Tolerance)
			r.Confirmed, r.ConfirmedStart = confirmed(l, first, opts.Immediate, deferPolicy, class, w)
			if w.N > 0 {
				r.Excess = max(0, r.MaxInWindow-w.N)
				r.ConfirmedExcess = max(0, r.Confirmed-w.N)
			}
			out = append(out, r)
		}
	}
	return out
}

// worstWindow returns the place of the window a device is judged by:
// the first that is violated, else the one with the largest excess,
// else the first.
func worstWindow(ws []WindowResult, released bool) int {
	best := 0
	for i, w := range ws {
		if w.violation(released) {
			return i
		}
		if w.Excess > ws[best].Excess {
			best = i
		}
	}
	return best
}

// point is a first arrival and its payload size.
type point struct {
	at   time.Time
	size int
}

// maxInWindow returns the largest number of w's units (messages or
// bytes) among pts in any half-open window [s, s+span) and the earliest
// start s achieving it; pts must be sorted by time. A window of
// span <= 0 holds at most one arrival.
func maxInWindow(pts []point, w devicelimit.Limit, span time.Duration) (int, time.Time) {
	best, start := 0, time.Time{}
	sum, j := 0, 0
	for i := range pts {
		if j < i+1 {
			j, sum = i+1, w.Units(pts[i].size)
		}
		for j < len(pts) && pts[j].at.Sub(pts[i].at) < span {
			sum += w.Units(pts[j].size)
			j++
		}
		if sum > best || best == 0 && i == 0 {
			best, start = sum, pts[i].at
		}
		sum -= w.Units(pts[i].size)
	}
	return best, start
}
