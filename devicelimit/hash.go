package devicelimit

import "hash/maphash"

var hashSeed = maphash.MakeSeed()

// hashString spreads device IDs over shards. The seed is per process, so
// shard placement cannot be aimed at from outside.
func hashString(s string) uint64 { return maphash.String(hashSeed, s) }
