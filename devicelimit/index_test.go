package devicelimit

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// TestIndexAgainstMap runs random inserts, lookups and deletions on an
// index and on a map, with few keys so that probe runs collide and wrap
// around the end of the slots, and checks that both always agree and
// that every entry stays reachable from its home.
func TestIndexAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	long := strings.Repeat("x", longKey+3) // stored behind a string header
	keys := []string{"", long, long[1:]}
	for i := range 40 {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	var x index
	want := map[string]uint32{}
	for step := range 100_000 {
		key := keys[rng.IntN(len(keys))]
		// A copy of key with its own bytes: equal keys need not share
		// their data pointer.
		if rng.IntN(2) == 0 {
			key = strings.Clone(key)
		}
		h := hashString(key)
		switch op := rng.IntN(3); {
		case op == 0 && want[key] == 0:
			ref := uint32(step + 1)
			x.insert(key, h, ref)
			want[key] = ref
		case op == 1:
			if i := x.find(key, h); i >= 0 {
				x.deleteAt(i)
			}
			delete(want, key)
		default:
			got, ok := x.get(key, h)
			if w, in := want[key]; ok != in || got != w {
				t.Fatalf("step %d: get(%.10q) = %d, %v; want %d, %v", step, key, got, ok, w, in)
			}
		}
		if x.n != len(want) {
			t.Fatalf("step %d: %d entries, want %d", step, x.n, len(want))
		}
		if step%97 == 0 {
			checkIndex(t, &x, want)
		}
	}
}

// checkIndex checks that the index holds exactly want and that no empty
// slot lies between an entry and its home.
func checkIndex(t *testing.T, x *index, want map[string]uint32) {
	t.Helper()
	n := 0
	for i := range x.slots {
		s := &x.slots[i]
		if s.meta == 0 {
			continue
		}
		n++
		key := s.keyString()
		if w, ok := want[key]; !ok || w != s.ref() {
			t.Fatalf("slot %d holds %.10q -> %d, want %d (present %v)", i, key, s.ref(), w, ok)
		}
		for j := x.home(hashString(key)); j != i; j = (j + 1) % len(x.slots) {
			if x.slots[j].meta == 0 {
				t.Fatalf("empty slot %d between %.10q's home and its slot %d", j, key, i)
			}
		}
	}
	if n != len(want) {
		t.Fatalf("%d slots used, want %d", n, len(want))
	}
}

// TestSweepEvictsShiftedEntries fills one shard, lets every window
// expire and sweeps: the backward shift of each eviction moves entries
// into slots the sweep has passed, and none of them may be missed.
func TestSweepEvictsShiftedEntries(t *testing.T) {
	tab := newTable(t, 10)
	q := Quota{Limit: 5, Window: time.Second}
	s0 := shardOf(tab, "d0")
	n := 0
	for i := 0; n < 2000; i++ {
		if d := fmt.Sprintf("d%d", i); shardOf(tab, d) == s0 {
			tab.AllowAt(d, q, t0)
			n++
		}
	}
	if got := tab.Sweep(t0.Add(3 * time.Second)); got != n {
		t.Fatalf("Sweep evicted %d windows, want %d", got, n)
	}
	if got := tab.Len(); got != 0 {
		t.Fatalf("Len after sweep = %d, want 0", got)
	}
}
