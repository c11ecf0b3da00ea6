// Package standingtest checks the promise of a device's standing
// (devicelimit.Standing) on any backend that decides and reads it: after
// r = k, the next k publishes (bytes) the device alone sends within t
// are admitted. devicelimit's tests run it on a Table, cluster's on
// Redis. Instants are whole microseconds, Redis's resolution.
package standingtest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// Kinds is the number of window kinds RandomCase draws from: a message
// window, a byte window, a topic class of both, a group above a message
// window, several windows and a group's in shadow mode.
const Kinds = 5

// Case is one random history of a device and the windows it runs under.
type Case struct {
	Buckets  int
	Device   string
	Class    string
	Q, GQ    devicelimit.Quota
	GroupKey string // "" for none
	History  []Msg
	// LookAt and LookSize are the message whose acknowledgement carries
	// the standing.
	LookAt   devicelimit.Tick
	LookSize int
}

// Msg is a publish of Size bytes at At.
type Msg struct {
	At   devicelimit.Tick
	Size int
}

const us = time.Microsecond

// RandomCase draws a case of window kind kind (0 to Kinds-1) for
// device, starting at t0.
func RandomCase(r *rand.Rand, kind int, device string, t0 devicelimit.Tick) Case {
	c := Case{Buckets: 1 + r.IntN(30), Device: device}
	minW := time.Duration(c.Buckets) * 10 * time.Millisecond
	win := func() time.Duration {
		return minW + time.Duration(r.Int64N(int64(20*minW))).Round(time.Millisecond)
	}
	msgs := func() devicelimit.Limit {
		return devicelimit.Limit{Unit: devicelimit.Messages, N: 1 + r.IntN(20), Window: win()}
	}
	bytes := func() devicelimit.Limit {
		return devicelimit.Limit{Unit: devicelimit.Bytes, N: 50 + r.IntN(500), Window: win()}
	}
	switch kind {
	case 0:
		c.Q = devicelimit.WithWindows(devicelimit.PolicyDrop, msgs())
	case 1:
		c.Q = devicelimit.WithWindows(devicelimit.PolicyDrop, bytes())
	case 2:
		c.Class = "tele"
		c.Q = devicelimit.WithWindows(devicelimit.PolicyDrop, msgs(), bytes())
	case 3:
		c.Q = devicelimit.WithWindows(devicelimit.PolicyDrop, msgs())
		c.GroupKey, c.GQ = devicelimit.GroupKey("acme-"+device), devicelimit.WithWindows(devicelimit.PolicyDrop, msgs())
	default:
		c.Q = devicelimit.WithWindows(devicelimit.PolicyDrop, msgs(), msgs(), bytes())
		c.Q.Shadow = r.IntN(2) == 0
		c.GroupKey, c.GQ = devicelimit.GroupKey("acme-"+device), devicelimit.WithWindows(devicelimit.PolicyDrop, msgs(), bytes())
		c.GQ.Shadow = true
	}
	now := t0.Add(time.Duration(r.Int64N(int64(time.Second))).Truncate(us))
	for n := r.IntN(60); n > 0; n-- {
		now = now.Add(time.Duration(r.Int64N(int64(c.Q.Shortest()) / 4)).Truncate(us))
		c.History = append(c.History, Msg{now, r.IntN(60)})
	}
	c.LookAt = now.Add(time.Duration(r.Int64N(int64(c.Q.Shortest()))).Truncate(us))
	c.LookSize = r.IntN(60)
	return c
}

// Backend decides a case's publishes and reads its standing.
type Backend interface {
	// Allow decides (and counts) a publish of size bytes at at; true
	// when every window admits it.
	Allow(c *Case, size int, at devicelimit.Tick) bool
	// Standing fills s as devicelimit.Table.StandingAt does.
	Standing(c *Case, size int, refused bool, at devicelimit.Tick, s *devicelimit.Standing)
}

// TableBackend runs cases on a devicelimit.Table.
type TableBackend struct{ Table *devicelimit.Table }

// Allow implements Backend.
func (b TableBackend) Allow(c *Case, size int, at devicelimit.Tick) bool {
	if c.GroupKey != "" {
		return b.Table.AllowGroupAt(c.Device, c.Class, c.Q, c.GroupKey, c.GQ, size, at).Allowed
	}
	return b.Table.AllowClassAt(c.Device, c.Class, c.Q, size, at).Allowed
}

// Standing implements Backend.
func (b TableBackend) Standing(c *Case, size int, refused bool, at devicelimit.Tick, s *devicelimit.Standing) {
	b.Table.StandingAt(c.Device, c.Class, c.Q, c.GroupKey, c.GQ, size, refused, at, s)
}

// Check runs case c on b, reads the standing the look message's
// acknowledgement would carry, and publishes skew more than it promises
// (0: exactly what it promises) at random instants before the earliest
// t: as many messages as the fewest any message window has left, of as
// many bytes in all as the fewest any byte window has left. It returns
// what went wrong at the first refusal among them, "" for none.
func Check(r *rand.Rand, c *Case, b Backend, skew int) string {
	for _, m := range c.History {
		b.Allow(c, m.Size, m.At)
	}
	refused := !b.Allow(c, c.LookSize, c.LookAt)
	var s devicelimit.Standing
	b.Standing(c, c.LookSize, refused, c.LookAt, &s)
	const none = -1
	msgR, byteR, horizon := none, none, time.Duration(0)
	for _, w := range s.Windows[:s.N] {
		p := &msgR
		if w.Limit.Unit == devicelimit.Bytes {
			p = &byteR
		}
		if *p == none || w.Remaining < *p {
			*p = w.Remaining
		}
		if w.Reset > 0 && (horizon == 0 || w.Reset < horizon) {
			horizon = w.Reset
		}
	}
	var sizes []int
	switch {
	case byteR == none: // messages of any size
		for range msgR + skew {
			sizes = append(sizes, r.IntN(60))
		}
	case msgR == none: // bytes in messages of any number
		for left := byteR + skew; left > 0; {
			n := 1 + r.IntN(left)
			sizes = append(sizes, n)
			left -= n
		}
	default: // byteR bytes in msgR messages
		sizes = make([]int, msgR+skew)
		for left, i := byteR+skew, 0; left > 0 && len(sizes) > 0; i++ {
			if i == len(sizes)-1 {
				sizes[i] += left
				break
			}
			n := r.IntN(left + 1)
			sizes[i] += n
			left -= n
		}
	}
	offsets := make([]time.Duration, len(sizes))
	for i := range offsets {
		if horizon > 0 {
			offsets[i] = time.Duration(r.Int64N(int64(horizon))).Truncate(us)
		}
	}
	slices.Sort(offsets)
	for i, size := range sizes {
		if !b.Allow(c, size, c.LookAt.Add(offsets[i])) {
			return fmt.Sprintf("publish %d of %d (%d bytes) at look+%v refused; standing %+v", i+1, len(sizes), size, offsets[i], s.Windows[:s.N])
		}
	}
	return ""
}

// Run checks cases of every kind on the backends newBackend makes (one
// per case, given its bucket count), first as promised, then with r
// one too high, which must break promises. It returns the first broken
// promise, or a report of how many r+1 broke.
func Run(seed uint64, cases int, t0 devicelimit.Tick, newBackend func(buckets int) Backend) (report string, err error) {
	for kind := range Kinds {
		for _, skew := range []int{0, 1} {
			r := rand.New(rand.NewPCG(seed, uint64(kind)))
			broken := 0
			for i := range cases {
				c := RandomCase(r, kind, fmt.Sprint("dev-", kind, "-", skew, "-", i), t0)
				if msg := Check(r, &c, newBackend(c.Buckets), skew); msg != "" {
					if skew == 0 {
						return report, fmt.Errorf("kind %d case %d: %s", kind, i, msg)
					}
					broken++
				}
			}
			if skew == 1 {
				if broken == 0 {
					return report, fmt.Errorf("kind %d: r one too high broke no promise: the check cannot fail", kind)
				}
				report += fmt.Sprintf("kind %d: r+1 broke %d of %d promises; ", kind, broken, cases)
			}
		}
	}
	return report, nil
}
