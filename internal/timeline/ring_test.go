package timeline

import (
	"slices"
	"testing"
	"time"
)

// TestRing: counts land in the slot of their instant, slots passed
// over are emptied, an instant older than the ring is ignored, values
// saturate, and Read lists the slots oldest first ending at its instant.
func TestRing(t *testing.T) {
	m := int64(time.Minute)
	r := New[uint16](time.Minute, 3)
	t0 := 1000 * m
	r.Add(t0, 0, 2)
	r.Add(t0+m/2, 0, 1)
	r.Max(t0, 3, 40)
	r.Max(t0, 3, 10)
	r.Add(t0+m, 1, 5)
	start, got := r.Read(t0 + m)
	if start != t0-m {
		t.Fatalf("start %d, want %d", start, t0-m)
	}
	want := [][4]uint32{{}, {3, 0, 0, 40}, {0, 5, 0, 0}}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("slot %d: got %v, want %v (all %v)", i, got[i], want[i], got)
		}
	}
	r.Add(t0-5*m, 0, 1) // older than the ring: ignored
	r.Add(t0+3*m, 2, 70000)
	_, got = r.Read(t0 + 4*m)
	if got[1] != [4]uint32{0, 0, Saturated[uint16](), 0} || got[0] != [4]uint32{} || got[2] != [4]uint32{} {
		t.Fatalf("after a gap: got %v", got)
	}
	_, got = r.Read(t0 + 100*m)
	for i, s := range got {
		if s != [4]uint32{} {
			t.Fatalf("slot %d not emptied after an hour and more: %v", i, s)
		}
	}
}

// TestRingAllocs: Add and Max allocate nothing.
func TestRingAllocs(t *testing.T) {
	r := New[uint32](time.Minute, 60)
	at := int64(time.Hour)
	if n := testing.AllocsPerRun(100, func() { at += int64(time.Second); r.Add(at, 0, 1); r.Max(at, 3, 50) }); n != 0 {
		t.Fatalf("%v allocs per Add and Max, want 0", n)
	}
}

// Count is Add and Max at one instant, saturating alike, and allocates
// nothing.
func TestRingCount(t *testing.T) {
	m := int64(time.Minute)
	a, b := New[uint16](time.Minute, 3), New[uint16](time.Minute, 3)
	for _, s := range []struct {
		at     int64
		i      int
		v, use uint32
	}{{10 * m, 0, 1, 30}, {10*m + 1, 1, 2, 20}, {11 * m, 0, 70000, 90000}, {5 * m, 0, 1, 1}, {14 * m, 2, 3, 7}} {
		a.Count(s.at, s.i, s.v, 3, s.use)
		b.Add(s.at, s.i, s.v)
		b.Max(s.at, 3, s.use)
		_, ga := a.Read(s.at)
		_, gb := b.Read(s.at)
		if !slices.Equal(ga, gb) {
			t.Fatalf("at %d: Count gave %v, Add and Max %v", s.at, ga, gb)
		}
	}
	at := 20 * m
	if n := testing.AllocsPerRun(100, func() { at += int64(time.Second); a.Count(at, 0, 1, 3, 50) }); n != 0 {
		t.Fatalf("%v allocs per Count, want 0", n)
	}
}
