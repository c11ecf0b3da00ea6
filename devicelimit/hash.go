package devicelimit

import "hash/maphash"

// hashSeed is random per process, and so are the runtime's keys that
// maphash mixes in whatever the seed: no seed gives the same hashes in
// two processes. It decides where a window is kept and the order in
// which Collect and CollectLeases hand windows out, never a decision;
// a property test's run must not depend on it either, so that its seed
// replays it (TestLeaseSequencesReplay runs the lease tests under two
// seeds).
var hashSeed = maphash.MakeSeed()

// hashString spreads device IDs over shards (its low byte) and over the
// slots of a shard's index (the bits above). The seed is per process, so
// placement cannot be aimed at from outside.
func hashString(s string) uint64 { return maphash.String(hashSeed, s) }
