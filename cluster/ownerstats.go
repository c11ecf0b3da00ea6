package cluster

// OwnerStats are an Owner's counters since it started, and the devices
// it holds now (docs/operations.md, "Metrics").
type OwnerStats struct {
	// Claims of devices this gateway took (at their connection or first
	// decision); ClaimWaits of them waited for a live previous owner's
	// release; Charges the windows charged a lease the previous owner
	// could not account for.
	Claims, ClaimWaits, Charges uint64
	// Checkpoints written; Fenced of them refused because another
	// gateway owned the device meanwhile.
	Checkpoints, Fenced uint64
	// Releases of devices to another gateway or at Close.
	Releases uint64
	// Fallbacks are decisions taken by the failure policy because this
	// gateway could not use its lease (Redis unreachable, a claim
	// failed).
	Fallbacks uint64
	// Owned are the devices in the owner table now: decided here, being
	// claimed, or just lost.
	Owned int
	// GrantClaims are the claims of group grants sent to Redis (one
	// script call each, for all of a group's windows; ownergroup.go);
	// GrantRefused of them Redis refused (a window of the group was
	// full); GrantFailed are claims that failed or were not sent because
	// Redis was away (the decision took the failure policy).
	GrantClaims, GrantRefused, GrantFailed uint64
	// GrantUnits are the units the claims were granted, GrantReturned
	// the unused units given back (with a claim, by the sweep of idle
	// grants or at Close), by devicelimit.Unit.
	GrantUnits, GrantReturned [2]uint64
	// Grants are the groups this gateway holds grant state for now.
	Grants int
}

// Stats returns o's counters and the devices it holds.
func (o *Owner) Stats() OwnerStats {
	s := OwnerStats{
		Claims: o.stats.claims.Load(), ClaimWaits: o.stats.waits.Load(), Charges: o.stats.charges.Load(),
		Checkpoints: o.stats.checkpoints.Load(), Fenced: o.stats.fenced.Load(), Releases: o.stats.releases.Load(),
		Fallbacks: o.stats.fallbacks.Load(), GrantClaims: o.stats.grants.Load(), GrantRefused: o.stats.grantRefused.Load(),
		GrantFailed: o.stats.grantFailed.Load(),
	}
	for u := range s.GrantUnits {
		s.GrantUnits[u], s.GrantReturned[u] = o.stats.grantUnits[u].Load(), o.stats.grantBack[u].Load()
	}
	o.grants.mu.RLock()
	s.Grants = len(o.grants.m)
	o.grants.mu.RUnlock()
	for i := range o.shards {
		sh := &o.shards[i]
		sh.mu.RLock()
		for _, d := range sh.m {
			if !d.parted.Load() {
				s.Owned++
			}
		}
		sh.mu.RUnlock()
	}
	return s
}
