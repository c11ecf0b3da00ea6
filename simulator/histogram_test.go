package simulator

import (
	"slices"
	"testing"
	"time"
)

// TestLatencyHistogram checks the histogram counts every latency once,
// in a bucket whose bounds hold it, and that its p99 by bucket is the
// exact p99's bucket.
func TestLatencyHistogram(t *testing.T) {
	var lat []time.Duration
	for i := range 1000 {
		lat = append(lat, time.Duration(i*i)*time.Microsecond/3)
	}
	slices.Sort(lat)
	h := newHistogram(lat)
	var n int64
	prev := int64(-1)
	for _, b := range h.Buckets {
		if b[0] <= prev || b[1] <= 0 {
			t.Fatalf("bucket %v after %d: want increasing indexes, counts above 0", b, prev)
		}
		prev = b[0]
		n += b[1]
	}
	if n != int64(len(lat)) {
		t.Fatalf("histogram counts %d latencies, want %d", n, len(lat))
	}
	for _, d := range lat {
		i := histIndex(d)
		if d > time.Microsecond && (d >= h.Upper(i) || (i > 0 && d < h.Upper(i-1))) {
			t.Fatalf("%v in bucket %d of [%v, %v)", d, i, h.Upper(i-1), h.Upper(i))
		}
	}
	_, _, p99, _ := percentiles(lat)
	var seen int64
	for _, b := range h.Buckets {
		seen += b[1]
		if seen*100 >= int64(len(lat))*99 {
			if b[0] != histIndex(p99) {
				t.Fatalf("p99 by histogram in bucket %d, exact p99 %v in %d", b[0], p99, histIndex(p99))
			}
			break
		}
	}
}
