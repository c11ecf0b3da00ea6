package simulator

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// Group is the gateway's group (limits.rules[].group) every device of
// the fleet is in: a tenant. Its windows are shared by all of them; the
// checker judges the fleet's arrivals together against them.
type Group struct {
	// Name is the group's name at the gateway (a template filled in).
	Name string `json:"name"`
	// Quota is the group's windows.
	Quota devicelimit.Quota `json:"quota"`
}

// GroupResult is the checker's verdict on one group's windows: the
// first arrivals of all its devices together, window by window.
type GroupResult struct {
	Group   string         `json:"group"`
	Devices int            `json:"devices"`
	Windows []WindowResult `json:"windows"`
	// Violated reports a window whose excess is beyond the group's
	// allowance and confirmed by send and ack times.
	Violated bool `json:"violated"`
}

// judgeGroups judges the windows of every group of opts.Groups on the
// first arrivals of its devices' messages, all of them together (a
// message in a topic class counts in its device's group too).
func judgeGroups(logs []DeviceLog, opts CheckOptions) []GroupResult {
	var out []GroupResult
	names := make([]string, 0, len(opts.Groups))
	for name := range opts.Groups {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		// One log of all the group's messages: sequence numbers made
		// unique by the device's place, every message in the group's
		// own windows.
		merged := DeviceLog{Device: name, Quota: opts.Groups[name]}
		n := 0
		for _, l := range logs {
			if l.Group != name {
				continue
			}
			base := uint64(n) << 40
			n++
			for _, s := range l.Sent {
				s.Seq, s.Class = base|s.Seq, ""
				merged.Sent = append(merged.Sent, s)
			}
			for _, a := range l.Arrivals {
				a.Seq = base | a.Seq
				merged.Arrivals = append(merged.Arrivals, a)
			}
			merged.Allowance += l.Allowance
		}
		first, _ := firstArrivals(merged.Arrivals)
		ws := judgeWindows(merged, placeReleases(merged, first), opts, false, false)
		r := GroupResult{Group: name, Devices: n, Windows: ws}
		for _, w := range ws {
			r.Violated = r.Violated || w.violation(false)
		}
		out = append(out, r)
	}
	return out
}

// placeReleases returns first with each released message placed at its
// release instant instead of its arrival: the gateway decided on it
// then, and a subscriber that fell behind (a loaded machine) receives
// releases together, long after, so their arrivals crowd into windows
// they were never admitted in. A stamp is used only when it lies
// between the message's send and its arrival, where the release must
// be; one outside (another clock: the gateway's stepped) is ignored.
// first itself is returned when no arrival carries a stamp.
func placeReleases(l DeviceLog, first map[uint64]time.Time) map[uint64]time.Time {
	var placed map[uint64]time.Time
	for _, a := range l.Arrivals {
		if a.Released.IsZero() || a.Released.After(first[a.Seq]) {
			continue
		}
		if placed == nil {
			placed = maps.Clone(first)
		}
		placed[a.Seq] = a.Released
	}
	if placed == nil {
		return first
	}
	for _, s := range l.Sent {
		if at, ok := placed[s.Seq]; ok && at.Before(s.At) {
			placed[s.Seq] = first[s.Seq]
		}
	}
	return placed
}

// firstArrivals returns each sequence number's first arrival, and how
// many arrivals were extra deliveries.
func firstArrivals(as []Arrival) (map[uint64]time.Time, int) {
	first := make(map[uint64]time.Time, len(as))
	dups := 0
	for _, a := range as {
		if t, ok := first[a.Seq]; ok {
			dups++
			if a.At.Before(t) {
				first[a.Seq] = a.At
			}
			continue
		}
		first[a.Seq] = a.At
	}
	return first, dups
}

// describe says what the group's window allows and holds: "100
// messages per 10s: at most 100 in any window".
func (w WindowResult) describe() string {
	return fmt.Sprintf("%d %s per %s: at most %d in any window", w.Limit, w.Unit, w.WindowNS, w.MaxInWindow)
}
