package simulator

import (
	"strings"
	"time"
)

// pacer decides when an adaptive device may send its next message, from
// the feedback the gateway gave it: RateLimit-Policy at connect (which
// windows count bytes) and RateLimit on every acknowledgement. All its
// methods take the time; the zero value is not ready for use (newPacer).
// Not safe for concurrent use: one device's goroutine owns it.
//
// The rule, per window named in an acknowledgement's RateLimit (the
// windows that bound the message: its topic class's or the device's
// own, and the group's): with r messages left and t seconds until the
// window frees room, the window's next message may go t/(r+1) after
// the acknowledgement: pacing to r/t, the r messages it has room for
// spread over t and one more when the window frees room at t (t/r
// would leave the window a message short every t, as t is rounded up);
// with room for no message (r = 0, or fewer bytes left than the
// message's size) it may go after t, which after a refusal is the
// retry-after; t = 0 (the window is empty) holds nothing back. A message may go when every window that bounded
// the last message on its path allows it. An acknowledgement without
// RateLimit (feedback off, or above the feedback threshold) holds
// nothing back.
type pacer struct {
	// bytes names the windows that count payload bytes.
	bytes map[string]bool
	// notBefore is, per window name, when its next message may go.
	notBefore map[string]time.Time
	// bound is, per path (a topic class, "" for the device's own
	// quota), the windows that bounded its last message.
	bound map[string][]string
}

func newPacer() *pacer {
	return &pacer{bytes: map[string]bool{}, notBefore: map[string]time.Time{}, bound: map[string][]string{}}
}

// policies takes a RateLimit-Policy: the device's windows, at connect
// or after its quota changed.
func (p *pacer) policies(ps []RatePolicy) {
	clear(p.bytes)
	for _, pol := range ps {
		p.bytes[pol.Name] = pol.Bytes
	}
}

// isBytes reports whether the window name counts bytes: as its policy
// said, or, for a name the policy did not list, by its "-bytes" suffix.
func (p *pacer) isBytes(name string) bool {
	if b, ok := p.bytes[name]; ok {
		return b
	}
	return strings.HasSuffix(name, "-bytes")
}

// observe takes the RateLimit of the acknowledgement, received at now,
// of a message of size payload bytes on path; nil items (no RateLimit)
// hold nothing back. size is also what the next message will weigh.
func (p *pacer) observe(path string, items []RateRemaining, size int, now time.Time) {
	names := p.bound[path][:0]
	for _, it := range items {
		names = append(names, it.Name)
		unit := int64(1)
		if p.isBytes(it.Name) {
			unit = int64(max(size, 1))
		}
		room := it.R / unit // messages the window admits now
		var at time.Time
		switch {
		case room == 0:
			at = now.Add(max(it.T, time.Second)) // t = 0 with no room: a quota of 0, ask again later
		case it.T == 0:
			at = now
		default:
			at = now.Add(it.T / time.Duration(room+1))
		}
		p.notBefore[it.Name] = at
	}
	p.bound[path] = names
}

// ready returns when the next message on path may go: the latest of
// the windows that bounded the path's last message.
func (p *pacer) ready(path string) time.Time {
	var at time.Time
	for _, name := range p.bound[path] {
		if nb := p.notBefore[name]; nb.After(at) {
			at = nb
		}
	}
	return at
}
