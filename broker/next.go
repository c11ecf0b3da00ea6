package broker

// What a device's next message would get now, for the admin API's
// device status ("next message" on the console's device page): the
// decision OnPublish would take, by the same tests (blocks, policy
// defer's path, groups, shadow mode), on the windows as they stand,
// counting nothing.

import (
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// The outcomes of a Next.
const (
	NextAdmitted    = "admitted"
	NextRefused     = "refused"
	NextDeferred    = "deferred"
	NextWouldRefuse = "would_refuse" // shadow mode: let through, counted as refused
	NextBlocked     = "blocked"
)

// Next is what the next message of a device, in one topic class, would
// get now.
type Next struct {
	// Class is the topic class; "" for the device's own quota.
	Class string
	// Outcome is one of the Next* constants.
	Outcome string
	// By names what decides a message not admitted now: "window" (the
	// device's windows), "group" (its group's), "queue" (deferred
	// behind messages queued), "queue full" (refused: the device's
	// deferral queue is full) or "block"; "" when admitted.
	By string
	// RetryAfter is how long until the deciding window admits a
	// message, or the block ends; 0 when admitted or queued behind
	// others.
	RetryAfter time.Duration
	// Queued is how many messages of the class are queued before it.
	Queued int
}

// Peeker reads a device's windows of a class (or a group's, by its key)
// without counting: devicelimit.Table.PeekAllAt's contract; an error
// when the windows cannot be read (shared windows while Redis does not
// answer).
type Peeker func(device, class string, ls []devicelimit.Limit, size int, now devicelimit.Tick) (devicelimit.Verdict, error)

// NextMessages returns what device's next message would get now, for
// its own quota first, then for each of its topic classes; only the
// block when it is blocked (its connections are refused). A device not
// connected is judged as a connection naming it would be.
func (s *Server) NextMessages(device string, peek Peeker) ([]Next, error) {
	h := s.hook
	now := s.opts.Clock.Now()
	if until, blocked := h.blocks.until(device, now); blocked {
		return []Next{{Outcome: NextBlocked, By: "block", RetryAfter: until.Sub(now)}}, nil
	}
	v := h.viewOf(device)
	q, classes, _ := h.resolver.ContractAt(device, v.rule, v.ruleName, v.classes, now)
	out := make([]Next, 0, 1+len(classes))
	n, err := h.next(device, "", q, v, now, peek)
	if err != nil {
		return nil, err
	}
	out = append(out, n)
	for _, c := range classes {
		n, err := h.next(device, c.Name, c.Quota, v, now, peek)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// viewOf returns what the configuration gives device: its live
// connection's view, else a connection's naming it by the identity.
func (h *throttle) viewOf(device string) *ruleView {
	if c := h.liveConn(device); c != nil {
		return c.rules()
	}
	clientID, username := device, ""
	if h.identity == devicelimit.IdentityUsername {
		clientID, username = "", device
	}
	q, classes, src, m := h.resolver.RuleGroup(clientID, username)
	return &ruleView{rule: q, ruleName: src.Rule, classes: classes, group: groupOf{Membership: m}}
}

// next judges a message of class under q as OnPublish would.
func (h *throttle) next(device, class string, q devicelimit.Quota, v *ruleView, now devicelimit.Tick, peek Peeker) (Next, error) {
	n := Next{Class: class, Outcome: NextAdmitted}
	if h.defers(&q, v) {
		// deferrer.deferPublish: behind the queue when there is one,
		// else the windows decide whether it is stored.
		// The next message's size is not known: judged for the
		// smallest record the quota's message could make.
		smallest := int64(len(deferredRecord(&deferredMsg{Quota: q})))
		var full bool
		if n.Queued, full = h.def.queueState(device, class, smallest); n.Queued > 0 {
			n.Outcome, n.By = NextDeferred, "queue"
			if full {
				n.Outcome, n.By = NextRefused, "queue full"
			}
			return n, nil
		}
		vd, err := peek(device, class, q.Limits(), 0, now)
		if err != nil || vd.Allowed {
			return n, err
		}
		n.Outcome, n.By, n.RetryAfter = NextDeferred, "window", vd.RetryAfter
		if full {
			n.Outcome, n.By, n.RetryAfter = NextRefused, "queue full", 0
		}
		return n, nil
	}
	dv, err := peek(device, class, q.Limits(), 0, now)
	if err != nil {
		return n, err
	}
	d := devicelimit.GroupDecision{Decision: dv.Decision()}
	var gq devicelimit.Quota
	if v.group.Key != "" {
		gq = h.resolver.GroupQuotaAt(v.group.Membership, now)
		gv, err := peek(v.group.Key, "", gq.Limits(), 0, now)
		if err != nil {
			return n, err
		}
		d = devicelimit.CombineGroup(devicelimit.OrderOf(q, gq).Peeked(dv, gv))
	}
	if d.Allowed {
		return n, nil
	}
	n.Outcome, n.By, n.RetryAfter = NextRefused, "window", d.RetryAfter
	if d.Group {
		n.By = "group"
	}
	if letThrough(d, &q, &gq) {
		n.Outcome = NextWouldRefuse
	}
	return n, nil
}

// defers reports whether a message under q of a device of view v takes
// policy defer's path (OnPublish): never in shadow mode, nor for a
// device in a group (a deferred message would be released without its
// group's windows: policy defer drops).
func (h *throttle) defers(q *devicelimit.Quota, v *ruleView) bool {
	return q.Policy == devicelimit.PolicyDefer && h.def != nil && !q.Shadow && v.group.Key == ""
}

// letThrough reports whether a refusal d of a message under q (and gq,
// its group's, when it has one) is let through: the refusing part is
// in shadow mode.
func letThrough(d devicelimit.GroupDecision, q, gq *devicelimit.Quota) bool {
	return !d.Allowed && (d.Group && gq.Shadow || !d.Group && q.Shadow)
}

// queueState returns how many messages of device's class are queued or
// being stored, and whether its queue is full: it would take no message
// of n record bytes (deferPublish's bounds: messages and bytes per
// device, bytes of all devices).
func (d *deferrer) queueState(device, class string, n int64) (queued int, full bool) {
	sh := d.shard(device)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	dq := sh.queues[queueKey(device, class)]
	if dq == nil {
		dq = &devQueue{}
	} else {
		queued = len(dq.msgs) + dq.writers
	}
	return queued, !d.fits(dq, dq.writers+1, n) || d.budget.Load()+n+queuedMsgSize > d.limits.MaxTotalBytes
}
