// Package timeline keeps counts over time in fixed memory: a Ring is n
// slots of one step each, the newest holding now, each slot four
// values that add up (counts) or keep their greatest (peaks). The
// gateway keeps a device's outcomes by minute and by hour in two rings
// (broker/series.go) and a forward destination's deliveries and backlog likewise
// (admin).
package timeline

import "time"

// Value is a slot's value type: uint16 where a slot's counts stay small
// (a device's minute), uint32 elsewhere. Values saturate at their
// type's maximum instead of wrapping.
type Value interface{ ~uint16 | ~uint32 }

// Ring is n slots of step, the newest ending with the latest instant
// given. Its zero value is unusable: use New. Not safe for concurrent
// use: its owner locks.
type Ring[T Value] struct {
	step  int64 // nanoseconds
	last  int64 // the newest slot's number: instant / step
	slots [][4]T
}

// New returns a ring of n slots of step (both above 0), all empty.
func New[T Value](step time.Duration, n int) Ring[T] {
	return Ring[T]{step: int64(step), slots: make([][4]T, n)}
}

// slot returns the slot of instant at (nanoseconds), emptying the slots
// passed over since the newest; nil when at is older than the ring.
func (r *Ring[T]) slot(at int64) *[4]T {
	n := int64(len(r.slots))
	k := at / r.step
	if k > r.last {
		gap := min(k-r.last, n)
		for j := int64(0); j < gap; j++ {
			r.slots[mod(k-j, n)] = [4]T{}
		}
		r.last = k
	} else if r.last-k >= n {
		return nil
	}
	return &r.slots[mod(k, n)]
}

// Add adds v to value i of the slot of at, saturating. It allocates
// nothing.
func (r *Ring[T]) Add(at int64, i int, v uint32) {
	if s := r.slot(at); s != nil {
		add(s, i, v)
	}
}

// add adds v to value i of slot s, saturating.
func add[T Value](s *[4]T, i int, v uint32) {
	top := ^T(0)
	if uint64(s[i])+uint64(v) >= uint64(top) {
		s[i] = top
	} else {
		s[i] += T(v)
	}
}

// raise raises value i of slot s to v, saturating.
func raise[T Value](s *[4]T, i int, v uint32) {
	top := ^T(0)
	if uint64(v) >= uint64(top) {
		s[i] = top
	} else if T(v) > s[i] {
		s[i] = T(v)
	}
}

// AddMax is Add(at, i, v) and Max(at, j, m) with the slot found once
// (a device's every publish records both: broker/series.go).
func (r *Ring[T]) AddMax(at int64, i int, v uint32, j int, m uint32) {
	if s := r.slot(at); s != nil {
		add(s, i, v)
		raise(s, j, m)
	}
}

// Max raises value i of the slot of at to v, when v is greater
// (saturating).
func (r *Ring[T]) Max(at int64, i int, v uint32) {
	if s := r.slot(at); s != nil {
		raise(s, i, v)
	}
}

// Read returns the ring's slots as of instant at, oldest first, the
// last being at's, and the start of the first (nanoseconds); each value
// is widened to uint32, and Saturated (the type's maximum) marks a
// value that may have been more.
func (r *Ring[T]) Read(at int64) (start int64, slots [][4]uint32) {
	r.slot(at) // empties what went by
	n := int64(len(r.slots))
	k := max(at/r.step, r.last)
	slots = make([][4]uint32, n)
	for j := int64(0); j < n; j++ {
		s := r.slots[mod(k-n+1+j, n)]
		for i, v := range s {
			slots[j][i] = uint32(v)
		}
	}
	return (k - n + 1) * r.step, slots
}

// Saturated returns the greatest value of T: a value read at it may
// have been more.
func Saturated[T Value]() uint32 { return uint32(^T(0)) }

// Step returns the ring's slot length.
func (r *Ring[T]) Step() time.Duration { return time.Duration(r.step) }

// mod is k modulo n, from 0 to n-1 for a negative k too.
func mod(k, n int64) int64 { return ((k % n) + n) % n }

// Sum returns the sum of value i over the k slots ending with at's.
func (r *Ring[T]) Sum(at int64, k, i int) uint32 {
	return r.fold(at, k, i, func(acc, v uint32) uint32 { return acc + v })
}

// Peak returns the greatest value i of the k slots ending with at's.
func (r *Ring[T]) Peak(at int64, k, i int) uint32 {
	return r.fold(at, k, i, func(acc, v uint32) uint32 { return max(acc, v) })
}

func (r *Ring[T]) fold(at int64, k, i int, f func(acc, v uint32) uint32) uint32 {
	r.slot(at)
	n := int64(len(r.slots))
	last := max(at/r.step, r.last)
	var acc uint32
	for j := int64(0); j < min(int64(k), n); j++ {
		acc = f(acc, uint32(r.slots[mod(last-j, n)][i]))
	}
	return acc
}
