package forward

import (
	"hash/fnv"
	"strconv"
	"testing"
)

// TestConnOfIsStable: a device's connection is the same in every
// process (FNV-1a, no random seed), and devices spread over the
// connections.
func TestConnOfIsStable(t *testing.T) {
	for _, d := range []string{"meter-1", "", "a/very/long/device-id-ü"} {
		h := fnv.New64a()
		h.Write([]byte(d))
		if got, want := connOf(d, 1<<31-1), int(h.Sum64()%(1<<31-1)); got != want {
			t.Fatalf("connOf(%q) = %d, hash/fnv says %d", d, got, want)
		}
	}
	used := map[int]int{}
	for i := range 1000 {
		used[connOf("dev-"+strconv.Itoa(i), 4)]++
	}
	for c := range 4 {
		if used[c] < 150 {
			t.Fatalf("connection %d took %d of 1000 devices: %v", c, used[c], used)
		}
	}
}
