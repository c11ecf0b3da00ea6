package persist

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
)

// batch holds collected window changes for one snapshot: each change is a
// record in one arena, and an item (the record's offset and a sort key)
// in a list that holds no pointers. A snapshot of a million windows thus
// costs a few large allocations, reused from one snapshot to the next,
// and nothing for the garbage collector to scan.
//
// A record is the key length and the value length as 4-byte little-
// endian integers, the key, and the value (the window's encoding); a
// value length of delMark means a deletion.
type batch struct {
	items []item
	arena []byte
	tmp   []item // scratch for the radix sort
}

// item is one change: its record's offset in the arena, and pfx, 8 bytes
// of its key as a big-endian integer, for sorting.
type item struct {
	pfx uint64
	off uint64
}

const (
	recHeader = 8
	delMark   = math.MaxUint32
	// dead marks an item removed as superseded while sorting.
	dead = math.MaxUint64
)

// add appends a change: a window's encoding, or a deletion when enc is
// nil. Both bytes are copied.
func (b *batch) add(device string, enc []byte) {
	off := uint64(len(b.arena))
	vlen := uint32(len(enc))
	if enc == nil {
		vlen = delMark
	}
	b.arena = binary.LittleEndian.AppendUint32(b.arena, uint32(len(device)))
	b.arena = binary.LittleEndian.AppendUint32(b.arena, vlen)
	b.arena = append(b.arena, device...)
	b.arena = append(b.arena, enc...)
	b.items = append(b.items, item{off: off})
}

// grow makes room for about n more changes.
func (b *batch) grow(n int) {
	b.items = slices.Grow(b.items, n)
	b.arena = slices.Grow(b.arena, n*64)
}

// key returns the item's key.
func (b *batch) key(it item) []byte {
	klen := uint64(binary.LittleEndian.Uint32(b.arena[it.off:]))
	start := it.off + recHeader
	return b.arena[start : start+klen : start+klen]
}

// record returns the item's key and value; value is nil for a deletion.
func (b *batch) record(it item) (key, value []byte) {
	klen := uint64(binary.LittleEndian.Uint32(b.arena[it.off:]))
	vlen := binary.LittleEndian.Uint32(b.arena[it.off+4:])
	start := it.off + recHeader
	key = b.arena[start : start+klen : start+klen]
	if vlen == delMark {
		return key, nil
	}
	end := start + klen + uint64(vlen)
	return key, b.arena[start+klen : end : end]
}

// sort orders the items by key and keeps only the latest change of each
// key. Items of the same key are in collection order before sort (the
// changes kept from a failed snapshot come first), so the latest is the
// last.
func (b *batch) sort() {
	n := len(b.items)
	if n < 2 {
		return
	}
	if cap(b.tmp) < n {
		b.tmp = make([]item, n)
	}
	b.sortRange(b.items, b.tmp[:n], 0, true)
	out := b.items[:0]
	for _, it := range b.items {
		if it.off != dead {
			out = append(out, it)
		}
	}
	b.items = out
}

// smallSort is the size under which sortRange compares keys.
const smallSort = 32

// sortRange sorts items, whose keys all share their first depth bytes,
// stably by key: a most-significant-first radix sort, 8 bytes at a time.
// It skips the bytes all keys share, orders the next 8 with a stable
// least-significant-first radix sort of the integers they form, and
// sorts each run of items that agree on those 8 bytes the same way,
// deeper. When top is set, it marks all but the last item of every key
// dead.
func (b *batch) sortRange(items, tmp []item, depth int, top bool) {
	if len(items) <= smallSort {
		b.compareSort(items, top)
		return
	}
	lcp, maxLen := b.commonPrefix(items, depth)
	depth += lcp
	if depth >= maxLen {
		// The keys agree on every byte but may differ in length (a
		// key and itself followed by zero bytes have equal prefixes).
		b.compareSort(items, top)
		return
	}
	for i := range items {
		items[i].pfx = prefix(b.key(items[i]), depth)
	}
	radixSort(items, tmp)
	for i := 0; i < len(items); {
		j := i + 1
		for j < len(items) && items[j].pfx == items[i].pfx {
			j++
		}
		if j-i > 1 {
			b.sortRange(items[i:j], tmp[i:j], depth+8, false)
			if top {
				b.markSuperseded(items[i:j])
			}
		}
		i = j
	}
}

// compareSort sorts a few items stably by key.
func (b *batch) compareSort(items []item, top bool) {
	slices.SortStableFunc(items, func(x, y item) int { return bytes.Compare(b.key(x), b.key(y)) })
	if top {
		b.markSuperseded(items)
	}
}

// markSuperseded marks dead every item of sorted items followed by one
// of the same key.
func (b *batch) markSuperseded(items []item) {
	for i := 0; i+1 < len(items); i++ {
		if bytes.Equal(b.key(items[i]), b.key(items[i+1])) {
			items[i].off = dead
		}
	}
}

// commonPrefix returns the length of the prefix all keys share beyond
// depth, and the longest key's length.
func (b *batch) commonPrefix(items []item, depth int) (lcp, maxLen int) {
	first := b.key(items[0])
	lcp = len(first) - depth
	for _, it := range items {
		k := b.key(it)
		maxLen = max(maxLen, len(k))
		n := min(lcp, len(k)-depth)
		i := 0
		for i < n && k[depth+i] == first[depth+i] {
			i++
		}
		lcp = i
	}
	return lcp, maxLen
}

// prefix returns bytes depth..depth+8 of key as a big-endian integer,
// zero-padded: keys order as their prefixes do, or have equal ones.
func prefix(key []byte, depth int) uint64 {
	if depth+8 <= len(key) {
		return binary.BigEndian.Uint64(key[depth:])
	}
	var buf [8]byte
	if depth < len(key) {
		copy(buf[:], key[depth:])
	}
	return binary.BigEndian.Uint64(buf[:])
}

// radixSort sorts a stably by pfx, using tmp (as long as a) as scratch.
// Byte positions where all items agree cost no pass.
func radixSort(a, tmp []item) {
	var counts [8][256]int
	for _, it := range a {
		p := it.pfx
		for k := range 8 {
			counts[k][byte(p>>(8*k))]++
		}
	}
	src, dst := a, tmp
	for k := range 8 {
		c := &counts[k]
		shift := 8 * k
		if c[byte(src[0].pfx>>shift)] == len(src) {
			continue
		}
		sum := 0
		for i := range c {
			c[i], sum = sum, sum+c[i]
		}
		for _, it := range src {
			d := byte(it.pfx >> shift)
			dst[c[d]] = it
			c[d]++
		}
		src, dst = dst, src
	}
	if &src[0] != &a[0] {
		copy(a, src)
	}
}

// reset empties the batch after a successful write, keeping its memory
// unless a burst left it much larger than the batch it held.
func (b *batch) reset() {
	const keep = 1 << 16
	if cap(b.items) > keep && cap(b.items) > 4*len(b.items) {
		b.items, b.tmp = nil, nil
	}
	if cap(b.arena) > 64*keep && cap(b.arena) > 4*len(b.arena) {
		b.arena = nil
	}
	b.items = b.items[:0]
	b.arena = b.arena[:0]
}
