package persist

import (
	"cmp"
	"slices"
	"strings"
)

// batch holds collected window changes: entries in collection order
// until sort, their encodings packed in one arena, so a snapshot of a
// million windows costs two allocations, not two million.
type batch struct {
	entries []entry
	arena   []byte
}

// entry is one change: the window encoded at arena[off:off+n], or a
// deletion when n < 0. Offsets grow with every entry, deletions
// included (they take one byte), so off orders entries of the same
// device by collection time.
type entry struct {
	key string
	off uint32
	n   int32
}

func (b *batch) add(device string, enc []byte) {
	off := uint32(len(b.arena))
	if enc == nil {
		b.arena = append(b.arena, 0)
		b.entries = append(b.entries, entry{key: device, off: off, n: -1})
		return
	}
	b.arena = append(b.arena, enc...)
	b.entries = append(b.entries, entry{key: device, off: off, n: int32(len(enc))})
}

func (b *batch) value(e entry) []byte { return b.arena[e.off : e.off+uint32(e.n)] }

// sort sorts the entries by key and keeps the latest change of each key.
func (b *batch) sort() {
	slices.SortFunc(b.entries, func(x, y entry) int {
		if c := strings.Compare(x.key, y.key); c != 0 {
			return c
		}
		return cmp.Compare(x.off, y.off)
	})
	out := b.entries[:0]
	for i, e := range b.entries {
		if i+1 < len(b.entries) && b.entries[i+1].key == e.key {
			continue // a later change of the same device follows
		}
		out = append(out, e)
	}
	clear(b.entries[len(out):]) // drop the strings
	b.entries = out
}

// reset empties the batch after a successful write, keeping its memory
// unless a burst left it much larger than the batch it held.
func (b *batch) reset() {
	const keep = 1 << 16
	clear(b.entries)
	if cap(b.entries) > keep && cap(b.entries) > 4*len(b.entries) {
		b.entries = nil
	}
	if cap(b.arena) > 64*keep && cap(b.arena) > 4*len(b.arena) {
		b.arena = nil
	}
	b.entries = b.entries[:0]
	b.arena = b.arena[:0]
}
