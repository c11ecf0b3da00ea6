package persist

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestBatchSort checks the radix sort against a stable comparison sort on
// keys made to be hard: shared prefixes of every length, keys that are
// prefixes of others, zero bytes, and many changes of the same device.
func TestBatchSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	alphabets := []string{"ab", "\x00\x01", "0123456789", "abcdefghijklmnopqrstuvwxyz-/"}
	for round := range 300 {
		alpha := alphabets[round%len(alphabets)]
		prefix := strings.Repeat("tenant/", rng.IntN(4))
		n := []int{1, 2, 5, 31, 33, 100, 1000, 5000}[rng.IntN(8)]
		distinct := 1 + rng.IntN(n)
		keys := make([]string, distinct)
		for i := range keys {
			k := []byte(prefix)
			for range rng.IntN(20) {
				k = append(k, alpha[rng.IntN(len(alpha))])
			}
			if len(k) == 0 {
				k = append(k, 'x')
			}
			keys[i] = string(k)
		}
		type change struct {
			key string
			val []byte // nil: delete
		}
		var changes []change
		var b batch
		for i := range n {
			c := change{key: keys[rng.IntN(distinct)]}
			if rng.IntN(5) > 0 {
				c.val = []byte(fmt.Sprint(i))
			}
			changes = append(changes, c)
			b.add(c.key, c.val)
		}
		b.sort()

		// The reference: stable sort, keep the last change of each key.
		want := slices.Clone(changes)
		slices.SortStableFunc(want, func(x, y change) int { return strings.Compare(x.key, y.key) })
		var last []change
		for i, c := range want {
			if i+1 < len(want) && want[i+1].key == c.key {
				continue
			}
			last = append(last, c)
		}
		if len(b.items) != len(last) {
			t.Fatalf("round %d: %d items after sort, want %d", round, len(b.items), len(last))
		}
		for i, it := range b.items {
			k, v := b.record(it)
			if string(k) != last[i].key || !bytes.Equal(v, last[i].val) || (v == nil) != (last[i].val == nil) {
				t.Fatalf("round %d, item %d: %q=%q, want %q=%q", round, i, k, v, last[i].key, last[i].val)
			}
		}
		b.reset()
	}
}

// TestBatchSortKeepsOlderBatchFirst: changes kept from a failed snapshot
// come before newer ones, which win.
func TestBatchSortKeepsOlderBatchFirst(t *testing.T) {
	var b batch
	for i := range 100 {
		b.add(fmt.Sprintf("dev-%03d", i), []byte("old"))
	}
	b.sort()
	b.items = b.items[50:] // the first 50 were written
	for i := range 100 {
		if i%2 == 0 {
			b.add(fmt.Sprintf("dev-%03d", i), []byte("new"))
		}
	}
	b.sort()
	for _, it := range b.items {
		k, v := b.record(it)
		var i int
		fmt.Sscanf(string(k), "dev-%03d", &i)
		want := "old"
		if i%2 == 0 {
			want = "new"
		}
		if string(v) != want {
			t.Fatalf("%s=%s, want %s", k, v, want)
		}
	}
	if len(b.items) != 75 {
		t.Fatalf("%d items, want 75", len(b.items))
	}
}
