package devicelimit

import "unsafe"

// index maps the device IDs of one shard to their window records: open
// addressing with linear probing, 16-byte slots, four to a cache line.
// A slot holds the key's data pointer and length, 16 bits of its hash and
// the record's ref, so a lookup reads one line of slots (usually) and
// then the record, and compares key bytes only when hash bits and length
// match, and not even then when the caller passes the very string stored
// (a connection's device ID, asked again on every publish). A Go map
// reads its control word, its slot and then the key. Deletion shifts the
// following entries back, so there are no tombstones and a lookup never
// walks past a deleted slot. Guarded by the shard's lock.
type index struct {
	slots []islot
	n     int // live entries
}

// islot is one slot. key points at the key's bytes, or, for a key of
// longKey bytes or more, at a copy of its string header. The pointer
// keeps the key alive for the garbage collector, as a map key would.
type islot struct {
	key  unsafe.Pointer
	meta uint64 // tag<<48 | min(len, longKey)<<32 | ref+1; 0 when empty
}

const (
	longKey  = 0xffff
	metaKey  = ^uint64(0xffffffff) // tag and length
	minSlots = 8
)

// The index grows by half once it is more than 4/5 full: at that load
// linear probing finds a present key in about three slots.
const maxLoadNum, maxLoadDen = 4, 5

func keyMeta(h uint64, key string) uint64 {
	return h>>48<<48 | uint64(min(len(key), longKey))<<32
}

// home is the slot where the probe for a hash starts. The shard is
// chosen by the low byte of the hash, so the bits above it are used.
func (x *index) home(h uint64) int {
	return int(uint64(uint32(h>>8)) * uint64(len(x.slots)) >> 32)
}

func (s *islot) ref() uint32 { return uint32(s.meta) - 1 }

func (s *islot) setRef(ref uint32) { s.meta = s.meta&metaKey | uint64(ref+1) }

func (s *islot) keyString() string {
	if l := int(s.meta >> 32 & 0xffff); l != longKey {
		return unsafe.String((*byte)(s.key), l)
	}
	return *(*string)(s.key)
}

// matches reports whether the slot holds key, its hash bits and length
// already matched.
func (s *islot) matches(key string) bool {
	if s.meta>>32&0xffff == longKey {
		return *(*string)(s.key) == key
	}
	return unsafe.Pointer(unsafe.StringData(key)) == s.key || unsafe.String((*byte)(s.key), len(key)) == key
}

// find returns the position of key's slot, or -1. h is hashString(key).
func (x *index) find(key string, h uint64) int {
	if x.n == 0 {
		return -1
	}
	want := keyMeta(h, key)
	i := x.home(h)
	for {
		s := &x.slots[i]
		if s.meta == 0 {
			return -1
		}
		if s.meta&metaKey == want && s.matches(key) {
			return i
		}
		if i++; i == len(x.slots) {
			i = 0
		}
	}
}

// get returns key's ref.
func (x *index) get(key string, h uint64) (uint32, bool) {
	if i := x.find(key, h); i >= 0 {
		return x.slots[i].ref(), true
	}
	return 0, false
}

// insert adds key, which must be absent, with ref, and returns its
// position.
func (x *index) insert(key string, h uint64, ref uint32) int {
	if (x.n+1)*maxLoadDen > len(x.slots)*maxLoadNum {
		x.resize(max(minSlots, len(x.slots)+len(x.slots)/2, (x.n+1)*maxLoadDen/maxLoadNum+1))
	}
	p := unsafe.Pointer(unsafe.StringData(key))
	if len(key) >= longKey {
		k := new(string)
		*k = key
		p = unsafe.Pointer(k)
	}
	x.n++
	return x.put(islot{key: p, meta: keyMeta(h, key) | uint64(ref+1)}, h)
}

// put places a slot for a key known absent in the first free slot from
// its home, and returns the position.
func (x *index) put(s islot, h uint64) int {
	i := x.home(h)
	for x.slots[i].meta != 0 {
		if i++; i == len(x.slots) {
			i = 0
		}
	}
	x.slots[i] = s
	return i
}

// resize rebuilds the index with n slots. Slots keep only 16 bits of
// the hash, so each key is hashed again.
func (x *index) resize(n int) {
	old := x.slots
	x.slots = make([]islot, n)
	for i := range old {
		if s := &old[i]; s.meta != 0 {
			x.put(*s, hashString(s.keyString()))
		}
	}
}

// deleteAt empties the slot at i and shifts back the entries after it
// that would otherwise be cut off from their home. Iteration that
// deletes at i must look at i again: the entry now there is unvisited.
func (x *index) deleteAt(i int) {
	n := len(x.slots)
	x.n--
	for j := i; ; {
		if j++; j == n {
			j = 0
		}
		s := &x.slots[j]
		if s.meta == 0 {
			break
		}
		// The entry at j may move to the hole at i unless its home lies
		// cyclically in (i, j]: then the hole does not cut its probe.
		home := x.home(hashString(s.keyString()))
		if i <= j && i < home && home <= j || i > j && (i < home || home <= j) {
			continue
		}
		x.slots[i] = *s
		i = j
	}
	x.slots[i] = islot{}
}
