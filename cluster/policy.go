package cluster

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// Policy says how a decision is taken when Redis is unreachable or
// slower than the timeout.
type Policy uint8

// The failure policies. The zero value is PolicyLocal.
const (
	// PolicyLocal decides on this gateway's own in-memory window: each
	// gateway then enforces the quota on what it sees alone.
	PolicyLocal Policy = iota
	// PolicyFailOpen admits every message.
	PolicyFailOpen
	// PolicyFailClosed refuses every message as over the limit.
	PolicyFailClosed
)

var policyNames = [...]string{PolicyLocal: "local", PolicyFailOpen: "fail-open", PolicyFailClosed: "fail-closed"}

// String returns the policy's configuration name.
func (p Policy) String() string {
	if int(p) < len(policyNames) {
		return policyNames[p]
	}
	return fmt.Sprintf("policy(%d)", uint8(p))
}

// ParsePolicy returns the policy named s: local, fail-open or fail-closed.
func ParsePolicy(s string) (Policy, error) {
	for i, name := range policyNames {
		if s == name {
			return Policy(i), nil
		}
	}
	return 0, fmt.Errorf("%w: must be fail-open, fail-closed or local (got %q)", ErrInvalidPolicy, s)
}

// failRetryAfter is the RetryAfter of a refusal by PolicyFailClosed.
const failRetryAfter = time.Second

// fallback decides under the failure policy.
func (l *Limiter) fallback(device, class string, ls []devicelimit.Limit, size int, now devicelimit.Tick) devicelimit.Decision {
	l.health.fallbacks.Add(1)
	first := ls[0].N
	switch l.policy {
	case PolicyFailOpen:
		return devicelimit.Decision{Allowed: true, Limit: first, Remaining: first}
	case PolicyFailClosed:
		return devicelimit.Decision{Limit: first, Count: first, RetryAfter: failRetryAfter}
	}
	if class == "" && len(ls) == 1 && ls[0].Unit == devicelimit.Messages {
		return l.local.AllowAt(device, devicelimit.Quota{Limit: first, Window: ls[0].Window}, now)
	}
	return l.local.AllowAllAt(device, class, ls, size, now).Decision()
}

// health tracks whether Redis answers. After a failure, decisions go
// straight to the failure policy for retryInterval, so a dead Redis
// costs the publish path nothing; then Redis is tried again.
type health struct {
	log      *slog.Logger
	policy   Policy
	retry    time.Duration
	logEvery time.Duration
	start    time.Time

	downUntil atomic.Int64 // time.Since(start) in ns until which Redis is not tried
	down      atomic.Bool
	fallbacks atomic.Uint64

	mu           sync.Mutex // guards the log state
	lastLog      time.Duration
	loggedFallbk uint64
	lastBadLog   time.Duration
	badLogged    bool
}

// skip reports whether Redis is resting after a failure.
func (h *health) skip() bool {
	return h.down.Load() && int64(time.Since(h.start)) < h.downUntil.Load()
}

// failed records a failed decision. The first failure after success is
// logged at once; while Redis stays down, one line per logEvery.
func (h *health) failed(err error) {
	now := time.Since(h.start)
	h.downUntil.Store(int64(now + h.retry))
	first := !h.down.Swap(true)
	h.mu.Lock()
	defer h.mu.Unlock()
	if !first && now-h.lastLog < h.logEvery {
		return
	}
	h.lastLog = now
	n := h.fallbacks.Load()
	if first {
		h.log.Warn("redis unavailable; decisions follow the failure policy until it answers again",
			"policy", h.policy.String(), "err", err.Error())
	} else {
		h.log.Warn("redis still unavailable", "policy", h.policy.String(), "fallbacks", n-h.loggedFallbk, "err", err.Error())
	}
	h.loggedFallbk = n
}

// badWindow records a decision on a window key Redis holds but the
// script cannot read: at most one line per logEvery.
func (h *health) badWindow(device, key string) {
	now := time.Since(h.start)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.badLogged && now-h.lastBadLog < h.logEvery {
		return
	}
	h.badLogged, h.lastBadLog = true, now
	h.log.Error("unreadable window record in redis; the device's decisions follow the failure policy until the key is deleted",
		"device", device, "key", key, "policy", h.policy.String())
}

// ok records a decision Redis answered.
func (h *health) ok() {
	if h.down.Load() && h.down.Swap(false) {
		h.mu.Lock()
		n := h.fallbacks.Load() - h.loggedFallbk
		h.loggedFallbk = h.fallbacks.Load()
		h.mu.Unlock()
		h.log.Info("redis available again; decisions use the shared windows", "fallbacks", n)
	}
}

// Stats is what a Limiter has done since New.
type Stats struct {
	// Policy is the failure policy.
	Policy Policy
	// Fallbacks counts the decisions taken by the failure policy.
	Fallbacks uint64
	// Up is false from a failed decision until one succeeds again.
	Up bool
}

// Stats returns the limiter's counters.
func (l *Limiter) Stats() Stats {
	return Stats{Policy: l.policy, Fallbacks: l.health.fallbacks.Load(), Up: !l.health.down.Load()}
}
