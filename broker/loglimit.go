package broker

import (
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// logLimiter lets through at most one log line per key per window: the
// lines a client can cause (refusals, store failures, mochi's warnings)
// must not flood the log. The broker's hooks share one. A key is a kind
// and a name, so kinds never collide; the names of kind logDevice are
// device IDs, taken as they are so that a refusal's key costs nothing to
// build.
type logLimiter struct {
	t     *devicelimit.Table // one bucket: "at most one line per window" needs no precision
	clock devicelimit.Clock
}

// Kinds of limited log lines.
type logKind string

const (
	logDevice   logKind = ""         // a device refused by its window (refuse.go)
	logFull     logKind = "full"     // a deferral refused for a full queue, per device
	logRefused  logKind = "refused"  // a connection refused, per reason and address
	logProtocol logKind = "protocol" // a protocol error, per rule (protocheck.go)
	logDefer    logKind = "defer"    // a store or release failure, per kind (release.go)
	logMochi    logKind = "mochi"    // one of mochi's lines, per message (log.go)
	logForward  logKind = "forward"  // a publish the forward log did not take
	logGroup    logKind = "group"    // a group made with two quotas, per group (group.go)
)

func newLogLimiter(clock devicelimit.Clock) (*logLimiter, error) {
	t, err := devicelimit.NewTable(1)
	if err != nil {
		return nil, err
	}
	return &logLimiter{t: t, clock: clock}, nil
}

// allowAt reports whether a line of kind about name may be logged at
// now; when not, retry is how long until one may.
func (l *logLimiter) allowAt(kind logKind, name string, window time.Duration, now devicelimit.Tick) (ok bool, retry time.Duration) {
	key := name
	if kind != logDevice {
		key = "\x00" + string(kind) + "\x00" + name
	}
	d := l.t.AllowAt(key, devicelimit.Quota{Limit: 1, Window: window}, now)
	return d.Allowed, d.RetryAfter
}

// allow is allowAt now.
func (l *logLimiter) allow(kind logKind, name string, window time.Duration) bool {
	ok, _ := l.allowAt(kind, name, window, l.clock.Now())
	return ok
}

// sweep forgets the keys whose window has passed.
func (l *logLimiter) sweep(now devicelimit.Tick) { l.t.Sweep(now) }

// len returns the keys held.
func (l *logLimiter) len() int { return l.t.Len() }

// willAllowance lets one will per device per window through beyond the
// device's quota, so that presence tracking sees a device go offline
// even after a policy disconnect (will.go). A table of its own, one
// bucket: one will per window.
type willAllowance struct{ t *devicelimit.Table }

func newWillAllowance() (willAllowance, error) {
	t, err := devicelimit.NewTable(1)
	return willAllowance{t}, err
}

// take reports whether device may still send one will beyond its quota
// in the window (of length window) at now, and uses it up.
func (w willAllowance) take(device string, window time.Duration, now devicelimit.Tick) bool {
	return w.t.AllowAt(device, devicelimit.Quota{Limit: 1, Window: window}, now).Allowed
}

// sweep forgets the devices whose allowance window has passed.
func (w willAllowance) sweep(now devicelimit.Tick) { w.t.Sweep(now) }
