package simulator

import (
	"math"
	"time"
)

// Histogram counts latencies in buckets of geometric width: bucket i
// holds [BaseNS·2^(i/PerDoubling), BaseNS·2^((i+1)/PerDoubling)), and
// bucket 0 also all below. Buckets lists the buckets that are not
// empty, as [index, count] by index. The histograms of several runs add
// bucket by bucket, which gives the percentiles of all their messages
// together (scripts/lease-cost.sh pools its runs so) to within a
// bucket's width, 4.4 %.
type Histogram struct {
	BaseNS      int64      `json:"base_ns"`
	PerDoubling int        `json:"per_doubling"`
	Buckets     [][2]int64 `json:"buckets"`
}

// Histogram bounds: buckets from 1 µs, 16 to a doubling.
const (
	histBase        = time.Microsecond
	histPerDoubling = 16
)

// histIndex returns the bucket of d.
func histIndex(d time.Duration) int64 {
	if d <= histBase {
		return 0
	}
	return int64(math.Floor(histPerDoubling * math.Log2(float64(d)/float64(histBase))))
}

// newHistogram returns the histogram of sorted latencies.
func newHistogram(sorted []time.Duration) Histogram {
	h := Histogram{BaseNS: int64(histBase), PerDoubling: histPerDoubling, Buckets: [][2]int64{}}
	for _, d := range sorted {
		i := histIndex(d)
		if n := len(h.Buckets); n > 0 && h.Buckets[n-1][0] == i {
			h.Buckets[n-1][1]++
			continue
		}
		h.Buckets = append(h.Buckets, [2]int64{i, 1})
	}
	return h
}

// Upper returns the upper bound of bucket i.
func (h Histogram) Upper(i int64) time.Duration {
	return time.Duration(float64(h.BaseNS) * math.Exp2(float64(i+1)/float64(h.PerDoubling)))
}
