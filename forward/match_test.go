package forward

import (
	"hash/fnv"
	"strconv"
	"testing"
)

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		filter, topic string
		want          bool
	}{
		{"devices/#", "devices/a/b", true},
		{"devices/#", "devices", true},
		{"devices/#", "other/a", false},
		{"devices/+/t", "devices/a/t", true},
		{"devices/+/t", "devices/a/b/t", false},
		{"devices/+", "devices/a", true},
		{"devices/+", "devices", false},
		{"#", "anything/at/all", true},
		{"#", "$SYS/x", false},
		{"+/x", "$SYS/x", false},
		{"a/b", "a/b", true},
		{"a/b", "a/b/c", false},
		{"a/b/c", "a/b", false},
		{"a//b", "a//b", true},
		{"+", "", true},
	} {
		if got := Match(c.filter, c.topic); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.filter, c.topic, got, c.want)
		}
	}
}

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
