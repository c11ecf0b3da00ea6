package devicelimit

import (
	"encoding/binary"
	"time"
)

// A slab holds the windows of one shard with one counter width, packed
// in a single byte slice without pointers, so a million windows cost the
// garbage collector nothing to scan. A window record is
//
//	[0:8)   head: bucket number of the newest bucket (int64)
//	[8:16)  length T the buckets are cut for (ns), with two flags in its
//	        top bits: dirty (changed since the last Collect) and stored
//	        (a Collect has handed it out, so a store may hold it)
//	[16:16+w)         total of the counts
//	[16+w:16+w+S*w)   S = buckets+1 counters, bucket k in slot k mod S
//
// padded to 8 bytes. Counters are 1, 2 or 4 bytes wide (the width class),
// wide enough for the largest limit the window has been used with: no
// counter can exceed the limit it was admitted under.
type slab struct {
	data   []byte
	free   []uint32
	stride int
	width  int
	// leases holds each record's lease when leased (lease.go).
	leases []lease
	leased bool
}

const recHeader = 16

// Width classes: a window's counters are as narrow as its limit allows.
const (
	class8 = iota
	class16
	class32
	numClasses
)

var classWidth = [numClasses]int{1, 2, 4}

func classFor(limit int) int {
	switch {
	case limit <= 0xff:
		return class8
	case limit <= 0xffff:
		return class16
	default:
		return class32
	}
}

func newSlab(class, slots int) slab {
	w := classWidth[class]
	return slab{stride: (recHeader + w*(slots+1) + 7) &^ 7, width: w}
}

// alloc returns the index of a zeroed record.
func (s *slab) alloc() uint32 {
	if n := len(s.free); n > 0 {
		i := s.free[n-1]
		s.free = s.free[:n-1]
		clear(s.rec(i).b)
		if s.leased {
			s.leases[i] = lease{}
		}
		return i
	}
	i := uint32(len(s.data) / s.stride)
	s.data = append(s.data, make([]byte, s.stride)...)
	if s.leased {
		s.leases = append(s.leases, lease{})
	}
	return i
}

func (s *slab) release(i uint32) { s.free = append(s.free, i) }

func (s *slab) rec(i uint32) rec {
	off := int(i) * s.stride
	return rec{b: s.data[off : off+s.stride : off+s.stride], w: s.width}
}

// rec is a view of one window record.
type rec struct {
	b []byte
	w int
}

func (r rec) head() int64     { return int64(binary.LittleEndian.Uint64(r.b[0:8])) }
func (r rec) setHead(h int64) { binary.LittleEndian.PutUint64(r.b[0:8], uint64(h)) }

// Flags kept in the top bits of the length word; MaxWindow needs 52.
const (
	flagDirty  = 1 << 63
	flagStored = 1 << 62
	// 1 << 61 was a crash charge's flag, never stored.
	// flagIdle: the window had an open lease when last collected and
	// admitted nothing since (see Table.CollectLeases).
	flagIdle = 1 << 60
	flagMask = flagDirty | flagStored | flagIdle
)

func (r rec) lengthWord() uint64    { return binary.LittleEndian.Uint64(r.b[8:16]) }
func (r rec) length() time.Duration { return time.Duration(r.lengthWord() &^ flagMask) }
func (r rec) flags() uint64         { return r.lengthWord() & flagMask }
func (r rec) setFlags(f uint64)     { binary.LittleEndian.PutUint64(r.b[8:16], r.lengthWord()&^flagMask|f) }
func (r rec) setLength(d time.Duration) {
	binary.LittleEndian.PutUint64(r.b[8:16], r.flags()|uint64(d))
}
func (r rec) total() int           { return r.word(recHeader) }
func (r rec) setTotal(v int)       { r.setWord(recHeader, v) }
func (r rec) count(slot int) int   { return r.word(recHeader + r.w*(slot+1)) }
func (r rec) setCount(slot, v int) { r.setWord(recHeader+r.w*(slot+1), v) }

func (r rec) word(off int) int {
	switch r.w {
	case 1:
		return int(r.b[off])
	case 2:
		return int(binary.LittleEndian.Uint16(r.b[off:]))
	default:
		return int(binary.LittleEndian.Uint32(r.b[off:]))
	}
}

func (r rec) setWord(off, v int) {
	switch r.w {
	case 1:
		r.b[off] = byte(v)
	case 2:
		binary.LittleEndian.PutUint16(r.b[off:], uint16(v))
	default:
		binary.LittleEndian.PutUint32(r.b[off:], uint32(v))
	}
}
