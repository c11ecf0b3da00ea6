package broker

import "github.com/devicegate/devicegate/devicelimit"

// Limiter takes the throttle's decisions: every device publish, and
// every release of a deferred message, goes through AllowAt. A
// *devicelimit.Table is one (the default: windows in this process);
// cluster.Limiter is another (windows shared by several gateways in
// Redis). Implementations must be safe for concurrent use and must not
// block the publish path for long: a slow backend decides by its own
// failure policy.
type Limiter interface {
	// AllowAt decides whether device may publish one message at now
	// under q, and counts it when allowed.
	AllowAt(device string, q devicelimit.Quota, now devicelimit.Tick) devicelimit.Decision
	// AllowClassAt is AllowAt for a message of size payload bytes in
	// topic class class ("" for the device's own quota) under a quota
	// that may have several windows (devicelimit.Table's).
	AllowClassAt(device, class string, q devicelimit.Quota, size int, now devicelimit.Tick) devicelimit.Decision
	// AllowGroupAt decides a message of a device in a group: its
	// windows (class, q) and its group's (groupKey, gq) together,
	// devicelimit.Table's contract.
	AllowGroupAt(device, class string, q devicelimit.Quota, groupKey string, gq devicelimit.Quota, size int, now devicelimit.Tick) devicelimit.GroupDecision
	// StandingAt fills s with the standing of the windows that bound a
	// message of size bytes of device in class under q, and of its
	// group's (groupKey, gq) when groupKey is not "": what its
	// acknowledgement tells it (devicelimit.Table's contract). refused
	// says the message was refused, or would have been in shadow mode.
	StandingAt(device, class string, q devicelimit.Quota, groupKey string, gq devicelimit.Quota, size int, refused bool, now devicelimit.Tick, s *devicelimit.Standing)
	// Buckets returns the number of buckets per window, which quotas
	// are validated against.
	Buckets() int
}

// limiterOf returns the limiter Options asks for: Options.Limiter, or
// the table when there is none.
func limiterOf(o *Options) Limiter {
	if o.Limiter != nil {
		return o.Limiter
	}
	return o.Table
}
