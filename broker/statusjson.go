package broker

import (
	"encoding/json"
	"slices"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"

	"github.com/devicegate/devicegate/devicelimit"
)

// deviceStatus is what the status topic tells a device: every window of
// its quota, its topic classes' and its group's, and where each stands.
type deviceStatus struct {
	Policies  []statusPolicy    `json:"policies"`
	Remaining []statusRemaining `json:"remaining"`
	Shadow    bool              `json:"shadow"`
	Blocked   bool              `json:"blocked"`
	// BlockedUntil is RFC 3339, omitted when not blocked.
	BlockedUntil string `json:"blocked_until,omitempty"`

	// on is false when the device's quota has feedback off; below
	// reports a window under its quota's feedback threshold; refusals
	// is the device's refusal count.
	on       bool
	below    bool
	refusals uint64
}

// statusPolicy is one window: RateLimit-Policy's item as JSON.
type statusPolicy struct {
	Name string `json:"name"`
	Q    int    `json:"q"`
	W    int64  `json:"w"`
	Unit string `json:"unit"` // messages or bytes
}

// statusRemaining is one window's standing: RateLimit's item as JSON.
type statusRemaining struct {
	Name string `json:"name"`
	R    int    `json:"r"`
	T    int64  `json:"t"`

	q int // for the order: tightest (lowest r/q) first
}

// json returns st as the status message's payload.
func (st *deviceStatus) json() []byte {
	b, _ := json.Marshal(st) // plain fields: cannot fail
	return b
}

// deviceStatus returns the status of cl's device at now; false when the
// broker does not know the connection.
func (h *throttle) deviceStatus(cl *mqtt.Client, now devicelimit.Tick) (deviceStatus, bool) {
	c := h.conns.info(cl)
	if c == nil {
		return deviceStatus{}, false
	}
	v := c.rules()
	q := h.resolver.QuotaAt(c.device, v.rule, now)
	if _, overridden := h.resolver.Override(c.device, now); !overridden && v.ruleName != "" {
		if enforce, ok := h.resolver.RuleEnforce(v.ruleName); ok {
			q.Shadow = !enforce
		}
	}
	classes := v.classes
	if o, ok := h.resolver.Override(c.device, now); ok && len(o.Classes) > 0 {
		classes = o.Classes
	}
	var gq devicelimit.Quota
	if v.group.Key != "" {
		gq = h.resolver.GroupQuotaAt(v.group.Membership, now)
	}
	st := deviceStatus{Shadow: q.Shadow, on: feedbackOn(&q, &gq, v.group.Key != ""), Policies: []statusPolicy{}, Remaining: []statusRemaining{}}
	if c.dev != nil {
		st.refusals = c.dev.history.refusals.Load()
	}
	var s devicelimit.Standing
	h.limiter.StandingAt(c.device, "", q, v.group.Key, gq, 0, false, now, &s)
	st.add(q, "", false, &s)
	for _, cl := range classes {
		h.limiter.StandingAt(c.device, cl.Name, cl.Quota, "", devicelimit.Quota{}, 0, false, now, &s)
		st.add(cl.Quota, cl.Name, false, &s)
	}
	if v.group.Key != "" {
		st.addPolicies(gq, "", true)
	}
	slices.SortStableFunc(st.Remaining, func(a, b statusRemaining) int {
		return cmpShare(a, b)
	})
	if until, blocked := h.blocks.until(c.device, now); blocked {
		st.Blocked, st.BlockedUntil = true, until.Time().UTC().Format(time.RFC3339)
	}
	return st, true
}

// add appends the policies of q's windows (of class) and the standing
// s of the windows that bound its messages (the group's among them),
// and notes whether one is under q's feedback threshold.
func (st *deviceStatus) add(q devicelimit.Quota, class string, group bool, s *devicelimit.Standing) {
	st.addPolicies(q, class, group)
	for _, w := range s.Windows[:s.N] {
		st.Remaining = append(st.Remaining, statusRemaining{
			Name: string(devicelimit.AppendPolicyName(nil, w.Class, w.Group, w.Limit)),
			R:    w.Remaining, T: ceilSeconds(w.Reset), q: w.Limit.N,
		})
	}
	if pct := statusThreshold(q.Feedback); pct > 0 {
		st.below = st.below || s.Below(pct)
	}
}

// addPolicies appends the policies of q's windows.
func (st *deviceStatus) addPolicies(q devicelimit.Quota, class string, group bool) {
	for _, l := range q.Limits() {
		p := statusPolicy{Name: string(devicelimit.AppendPolicyName(nil, class, group, l)), Q: l.N, W: ceilSeconds(l.Window), Unit: "messages"}
		if l.Unit == devicelimit.Bytes {
			p.Unit = "bytes"
		}
		st.Policies = append(st.Policies, p)
	}
}

// cmpShare orders a before b when it has less of its window left.
func cmpShare(a, b statusRemaining) int {
	x, y := int64(a.R)*int64(b.q), int64(b.R)*int64(a.q)
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// ceilSeconds returns d in whole seconds, rounded up, as the RateLimit
// fields give t and w.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
