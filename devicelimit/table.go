package devicelimit

import (
	"strings"
	"sync"
	"time"
)

const numShards = 256

// Table holds the sliding windows of every active device. Windows are
// created on a device's first message and evicted by Sweep once all their
// buckets have expired, so memory follows the active devices. A window
// uses buckets+1 counters of 1, 2 or 4 bytes (by the largest limit it has
// seen) and 16 bytes of header, packed in per-shard slabs, plus a 16-byte
// slot in its shard's index, which is kept at most 4/5 full (see index).
//
// Devices are spread over 256 shards, each with its own lock, so
// decisions on different devices rarely contend. Use NewTable; a Table is
// safe for concurrent use.
type Table struct {
	buckets   int
	minWindow time.Duration // buckets * MinBucketWidth
	lease     leases
	shards    [numShards]shard
}

type shard struct {
	mu    sync.Mutex
	index index // device -> ref: class<<30 | record index
	slabs [numClasses]slab
	cut   cut
	peak  int // most windows held since the last compaction
	// dirty lists the devices whose windows gained a count since the
	// last Collect, gone those evicted or reset after a Collect handed
	// them out. See Collect. dirty is kept only once a Collect has run
	// (collected): a table nobody collects (a log or connect-rate
	// limiter) would otherwise list its devices without end.
	dirty     []string
	gone      []goneWindow
	collected bool
	scratch   []byte // PeekAt's copy of a record (peekCopy)
	keyBuf    []byte // the key of a device's other windows (windowKey)
	_         [64]byte
}

// cut does a shard's bucket arithmetic for one bucket count and caches
// the last result of each division. Most devices share a window length,
// so consecutive decisions on a shard fall in the same bucket (a bucket
// lasts T/B, milliseconds at least) and, while refused, need the same
// bucket start: the 128-bit divisions are done about once a bucket.
// Guarded by the shard's lock.
type cut struct {
	buckets int

	// of is the bucket of the ticks [ofLo, ofHi) for window ofWindow.
	ofLo, ofHi Tick
	ofWindow   time.Duration
	of         int64

	startK      int64
	startWindow time.Duration
	start       Tick
}

// bucketOf returns bucketOf(t, c.buckets, window).
func (c *cut) bucketOf(t Tick, window time.Duration) int64 {
	if t < c.ofLo || t >= c.ofHi || window != c.ofWindow {
		// bucketOf(t) == k exactly when bucketStart(k) <= t < bucketStart(k+1).
		k := bucketOf(t, c.buckets, window)
		c.of, c.ofWindow = k, window
		c.ofLo, c.ofHi = bucketStart(k, c.buckets, window), bucketStart(k+1, c.buckets, window)
		if t < c.ofLo { // t < 0 counts as bucket 0 but lies before its start
			c.ofHi = c.ofLo
		}
	}
	return c.of
}

// bucketStart returns bucketStart(k, c.buckets, window).
func (c *cut) bucketStart(k int64, window time.Duration) Tick {
	if k != c.startK || window != c.startWindow {
		c.startK, c.startWindow, c.start = k, window, bucketStart(k, c.buckets, window)
	}
	return c.start
}

const (
	refClassShift = 30
	refIndexMask  = 1<<refClassShift - 1
)

// NewTable returns an empty table whose windows have the given number of
// buckets (DefaultBuckets when 0).
func NewTable(buckets int) (*Table, error) {
	if buckets == 0 {
		buckets = DefaultBuckets
	}
	if err := validBuckets(buckets); err != nil {
		return nil, err
	}
	t := &Table{buckets: buckets, minWindow: time.Duration(buckets) * MinBucketWidth}
	for i := range t.shards {
		t.shards[i].init(buckets + 1)
	}
	return t, nil
}

func (s *shard) init(slots int) {
	s.cut = cut{buckets: slots - 1, startK: -1} // [0, 0): nothing cached
	s.index = index{}
	for c := range s.slabs {
		leased := s.slabs[c].leased
		s.slabs[c] = newSlab(c, slots)
		s.slabs[c].leased = leased
	}
	s.peak = 0
}

// Buckets returns the number of buckets per window.
func (t *Table) Buckets() int { return t.buckets }

// shard returns the device's shard and the device ID's hash: a
// device ID holds no NUL (an MQTT string cannot), so it is a window's
// key of its own (the decision path).
func (t *Table) shard(device string) (*shard, uint64) {
	h := hashString(device)
	return &t.shards[h%numShards], h
}

// shardOfKey returns the shard of any window's key and the key's hash.
// A device's other windows (limits.go) are in its shard: the shard is
// the hash's of the key up to its first NUL.
func (t *Table) shardOfKey(key string) (*shard, uint64) {
	h := hashString(key)
	if i := stemEnd(key); i >= 0 {
		return &t.shards[hashString(key[:i])%numShards], h
	}
	return &t.shards[h%numShards], h
}

// stemEnd returns the place of the NUL that ends the stem of a window's
// key (the device ID, or a group's key, which starts with a NUL), -1
// when the key is its stem.
func stemEnd(key string) int {
	if len(key) > 0 && key[0] == 0 {
		if i := strings.IndexByte(key[1:], 0); i >= 0 {
			return i + 1
		}
		return -1
	}
	return strings.IndexByte(key, 0)
}

func (s *shard) rec(ref uint32) rec {
	return s.slabs[ref>>refClassShift].rec(ref & refIndexMask)
}

// lookup returns the device's record and its ref, creating it (when
// create is set) or widening it so its counters can hold limit. A new
// record keeps device as its key: the caller copies a key that lives
// in a buffer. Called with s.mu held. h is hashString(device).
func (s *shard) lookup(device string, h uint64, limit int, create bool) (rec, uint32, bool) {
	class := classFor(limit)
	i := s.index.find(device, h)
	switch {
	case i < 0 && !create:
		return rec{}, 0, false
	case i < 0:
		ref := uint32(class)<<refClassShift | s.slabs[class].alloc()
		s.index.insert(device, h, ref)
		s.peak = max(s.peak, s.index.n)
		return s.rec(ref), ref, true
	}
	slot := &s.index.slots[i]
	ref := slot.ref()
	if int(ref>>refClassShift) < class {
		old := s.rec(ref)
		s.free(ref)
		oref := ref
		ref = uint32(class)<<refClassShift | s.slabs[class].alloc()
		slot.setRef(ref)
		r := s.rec(ref)
		copyRec(r, old)
		if s.slabs[class].leased {
			*s.lease(ref) = *s.lease(oref)
		}
		return r, ref, true
	}
	return s.rec(ref), ref, true
}

// peekCopy returns a copy of the device's record, wide enough for limit,
// in the shard's scratch record: PeekAt re-cuts, advances and charges
// the copy, never the window (a read changes nothing). The scratch is
// made on the shard's first peek, for the widest class. Called with s.mu
// held.
func (s *shard) peekCopy(device string, h uint64, limit int) (rec, bool) {
	i := s.index.find(device, h)
	if i < 0 {
		return rec{}, false
	}
	src := s.rec(s.index.slots[i].ref())
	class := max(int(s.index.slots[i].ref()>>refClassShift), classFor(limit))
	if s.scratch == nil {
		s.scratch = make([]byte, s.slabs[numClasses-1].stride)
	}
	stride := s.slabs[class].stride
	dst := rec{b: s.scratch[:stride:stride], w: classWidth[class]}
	clear(dst.b)
	copyRec(dst, src)
	return dst, true
}

// lease returns the lease of record ref (a table with leases only).
func (s *shard) lease(ref uint32) *lease {
	return &s.slabs[ref>>refClassShift].leases[ref&refIndexMask]
}

func (s *shard) free(ref uint32) { s.slabs[ref>>refClassShift].release(ref & refIndexMask) }

// copyRec copies src into the wider (or equal) record dst.
func copyRec(dst, src rec) {
	dst.setHead(src.head())
	dst.setLength(src.length())
	dst.setFlags(src.flags())
	dst.setTotal(src.total())
	for i := 0; recHeader+src.w*(i+2) <= len(src.b); i++ {
		if recHeader+dst.w*(i+2) > len(dst.b) {
			break
		}
		dst.setCount(i, src.count(i))
	}
}

// AllowAt decides whether device may publish one message at now under
// quota q, and counts it when allowed. q must be valid for the table's
// bucket count (Quota.Validate); an invalid quota is refused, never
// admitted. AllowAt allocates nothing once the device has a window.
func (t *Table) AllowAt(device string, q Quota, now Tick) Decision {
	return t.decide(device, Limit{N: q.Limit, Window: q.Window}, now, true, !q.Shadow)
}

// PeekAt returns the decision AllowAt would make, without counting and
// without creating a window. It changes nothing: it decides on a copy of
// the window, so a peek under another window length leaves the
// window's bytes as they were, like
// x/time/rate's TokensAt.
func (t *Table) PeekAt(device string, q Quota, now Tick) Decision {
	return t.decide(device, Limit{N: q.Limit, Window: q.Window}, now, false, false)
}

// decide is AllowAt (count) or PeekAt; an admission takes a lease when
// lease is set and the table has leases.
func (t *Table) decide(device string, q Limit, now Tick, count, lease bool) Decision {
	if q.N < 1 || q.N > MaxLimit || q.Window < t.minWindow || q.Window > MaxWindow {
		return Decision{Limit: q.N}
	}
	s, h := t.shard(device)
	s.mu.Lock()
	var r rec
	var ref uint32
	var ok bool
	if count {
		r, ref, ok = s.lookup(device, h, q.N, true)
	} else {
		r, ok = s.peekCopy(device, h, q.N)
	}
	if !ok {
		s.mu.Unlock()
		return Decision{Limit: q.N, Remaining: q.N}
	}
	d := r.decideN(q, now, &s.cut, 1, count)
	if count && d.Allowed && r.flags()&flagDirty == 0 {
		r.setFlags(r.flags() | flagDirty)
		if s.collected {
			s.dirty = append(s.dirty, device)
		}
	}
	if d.Allowed && lease && t.lease.on {
		d.Lease = t.leaseAdmit(s, r, ref, device, q, 1)
	}
	s.mu.Unlock()
	return d
}

// Reset empties the device's window, and its other windows (limits.go:
// several windows, topic classes), and reports whether it had any. The
// other windows are found by a walk of the device's shard: Reset is an
// operator's action, not a decision's.
func (t *Table) Reset(device string) bool {
	s, h := t.shardOfKey(device)
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.index.find(device, h)
	had := i >= 0
	if had {
		s.drop(i, true)
	}
	if stemEnd(device) >= 0 {
		return had // a window's own key: that window only
	}
	prefix := device + "\x00"
	for i := 0; i < len(s.index.slots); {
		slot := &s.index.slots[i]
		if slot.meta == 0 || !strings.HasPrefix(slot.keyString(), prefix) {
			i++
			continue
		}
		// Eviction shifts a later entry into slot i: look at it next.
		s.drop(i, true)
		had = true
	}
	return had
}

// evict removes the window in index slot i, remembering its device for
// Collect if a store may hold it. Called with s.mu held.
func (s *shard) evict(i int) { s.drop(i, false) }

// drop is evict; leased also remembers a window that took a lease,
// which a lease write may hold (with its counts) before any Collect
// handed the window out: a topic class's window takes its first at its
// first admission. Reset drops so, the only eviction of a window whose
// lease is open. Called with s.mu held.
func (s *shard) drop(i int, leased bool) {
	slot := &s.index.slots[i]
	ref := slot.ref()
	var g goneWindow
	if s.slabs[ref>>refClassShift].leased {
		ls := s.lease(ref)
		g.inc, g.held = ls.inc, max(ls.cap, ls.adm)
	}
	if s.rec(ref).flags()&flagStored != 0 || leased && g.inc != 0 {
		g.key = slot.keyString()
		s.gone = append(s.gone, g)
	}
	s.free(ref)
	s.index.deleteAt(i)
}

// goneWindow is a window evicted or reset after a Collect handed it
// out: its key, and the incarnation of its lease (0: none), which a
// store needs to tell its deletion from a later incarnation's lease
// write under the same key (CollectLeases), and all its leases could
// have admitted: an evicted incarnation admits nothing more, so its
// deletion closes its lease (a reset window's is still open).
type goneWindow struct {
	key  string
	inc  uint64
	held uint64
}

// Len returns the number of windows held.
func (t *Table) Len() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += s.index.n
		s.mu.Unlock()
	}
	return n
}

// compactBelow is the shard size under which a shard is never rebuilt.
const compactBelow = 256

// Sweep evicts the windows that hold no count at now and no lease that a
// collection has still to write or close (leaseHeld), and returns how
// many it evicted. A shard that has shrunk to a quarter of its peak is rebuilt,
// so the memory of a past flood of devices is returned. Sweep locks one
// shard at a time.
func (t *Table) Sweep(now Tick) int {
	evicted := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for i := 0; i < len(s.index.slots); {
			slot := &s.index.slots[i]
			if slot.meta == 0 {
				i++
				continue
			}
			r := s.rec(slot.ref())
			if nb := bucketOf(now, t.buckets, r.length()); nb > r.head() {
				r.advance(nb, t.buckets+1)
			}
			if r.total() != 0 || t.leaseHeld(s, slot.ref()) {
				i++
				continue
			}
			// Eviction shifts a later entry into slot i: look at it
			// next. (One from the wrapped start of the array may come
			// twice; a second look changes nothing.)
			s.evict(i)
			evicted++
		}
		if s.peak >= compactBelow && s.index.n*4 <= s.peak {
			s.compact(t.buckets + 1)
		}
		s.mu.Unlock()
	}
	return evicted
}

// compact rebuilds the shard's index and slabs at their live size.
func (s *shard) compact(slots int) {
	oldSlots, oldSlabs := s.index.slots, s.slabs
	s.index = index{slots: make([]islot, slotsFor(s.index.n))}
	for c := range s.slabs {
		s.slabs[c] = newSlab(c, slots)
		s.slabs[c].leased = oldSlabs[c].leased
	}
	for i := range oldSlots {
		old := &oldSlots[i]
		if old.meta == 0 {
			continue
		}
		ref := old.ref()
		class := ref >> refClassShift
		nref := class<<refClassShift | s.slabs[class].alloc()
		copy(s.rec(nref).b, oldSlabs[class].rec(ref&refIndexMask).b)
		if s.slabs[class].leased {
			*s.lease(nref) = oldSlabs[class].leases[ref&refIndexMask]
		}
		moved := *old
		moved.setRef(nref)
		s.index.put(moved, hashString(old.keyString()))
		s.index.n++
	}
	s.peak = s.index.n
}

// slotsFor returns an index size that holds n entries below the maximum
// load.
func slotsFor(n int) int { return max(minSlots, n*maxLoadDen/maxLoadNum+1) }

// Grow makes room for about n windows, so that restoring n windows at
// start-up does not rehash and regrow as it goes. It only affects empty
// shards.
func (t *Table) Grow(n int) {
	per := n/numShards + n/numShards/8 + 1 // hashing spreads shards unevenly
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		if s.index.n == 0 {
			s.index = index{slots: make([]islot, slotsFor(per))}
			// No window is live, so every record is free: the free list
			// goes with the old records, or alloc would hand out one
			// index twice.
			sl := &s.slabs[class8]
			sl.data = make([]byte, 0, per*sl.stride)
			sl.free = nil
			if sl.leased {
				sl.leases = make([]lease, 0, per)
			}
		}
		s.mu.Unlock()
	}
}

// Devices calls fn with the ID of every device that has a window of its
// own quota (not a topic class's or a group's), shard by shard, with the
// shard locked: fn must be quick and must not call the Table. device is
// valid only during the call (strings.Clone keeps it).
func (t *Table) Devices(fn func(device string)) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for j := range s.index.slots {
			if sl := &s.index.slots[j]; sl.meta != 0 {
				if key := sl.keyString(); stemEnd(key) < 0 && (len(key) == 0 || key[0] != 0) {
					fn(key)
				}
			}
		}
		s.mu.Unlock()
	}
}
