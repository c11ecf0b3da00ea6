package broker

import (
	"sync"
	"time"
)

// Devices connecting together wait for one lease commit (preleaseOf),
// and were let go together when it was durable: a storm's connections
// left the commit in cohorts, and a device that starts its publishing
// timer at its CONNACK (most firmware, and the simulator's steady
// schedule) then published with its cohort, every period, for good,
// where the same devices without leases kept the spacing they
// connected with. make bench-lease measured the difference: delivery
// p99 1.48x with leases for the steady fleet, where the Poisson fleet,
// whose gaps are random, measured 1.19x (docs/durability.md). So a
// commit's CONNACKs go out spaced as their connections asked: each
// waits, after the commit, as long after the batch's first ask as it
// asked (cohorts.offset), at most maxCohortSpacing. Every connection
// of a batch then waits about what its first one waited.

// maxCohortSpacing bounds the wait a CONNACK adds after its lease is
// durable: a slow commit's batch beyond it goes out together.
const maxCohortSpacing = 25 * time.Millisecond

// cohorts keeps the first ask of the latest lease batch.
type cohorts struct {
	mu    sync.Mutex
	gen   uint32    // the batch; 0: none yet
	first time.Time // its first ask
}

// offset records that a connection asked its first leases at at, in
// lease batch gen, and returns how long after that batch's first ask
// it asked, at most maxCohortSpacing; 0 for the first, and for a batch
// older than the latest seen (its first ask is not kept).
func (c *cohorts) offset(gen uint32, at time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case gen == c.gen:
		return min(max(at.Sub(c.first), 0), maxCohortSpacing)
	case c.gen == 0 || int32(gen-c.gen) > 0:
		c.gen, c.first = gen, at
	}
	return 0
}
