package devicelimit

import (
	"math/bits"
	"time"
)

// Bucket arithmetic. Bucket k of a window of length T cut into B buckets
// covers the ticks t with floor(t*B/T) == k: exact rational boundaries, so
// B buckets always span exactly T whatever T and B are. The products are
// taken in 128 bits: t*B overflows int64 for today's ticks.

// bucketOf returns floor(t*B/T); t < 0 counts as 0.
func bucketOf(t Tick, buckets int, window time.Duration) int64 {
	if t <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(t), uint64(buckets))
	q, _ := bits.Div64(hi, lo, uint64(window))
	return int64(q)
}

// bucketStart returns the first tick of bucket k: ceil(k*T/B).
func bucketStart(k int64, buckets int, window time.Duration) Tick {
	if k <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(k), uint64(window))
	var carry uint64
	lo, carry = bits.Add64(lo, uint64(buckets-1), 0)
	hi += carry
	q, _ := bits.Div64(hi, lo, uint64(buckets))
	return Tick(q)
}
