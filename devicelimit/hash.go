package devicelimit

import "hash/maphash"

var hashSeed = maphash.MakeSeed()

// hashString spreads device IDs over shards (its low byte) and over the
// slots of a shard's index (the bits above). The seed is per process, so
// placement cannot be aimed at from outside.
func hashString(s string) uint64 { return maphash.String(hashSeed, s) }
