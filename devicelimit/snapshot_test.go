package devicelimit

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

func TestSnapshotRoundTrip(t *testing.T) {
	tab := newTable(t, 4)
	q := Quota{Limit: 10, Window: 100 * ms}
	for _, at := range []time.Duration{0, 0, 30 * ms, 60 * ms, 99 * ms} {
		tab.AllowAt("dev", q, t0.Add(at))
	}
	w, ok := tab.Snapshot("dev")
	if !ok || w.Total() != 5 || len(w.Counts) != 5 || w.Length != q.Window {
		t.Fatalf("snapshot %+v, %v", w, ok)
	}
	b, err := w.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got Window
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if got.Length != w.Length || got.Head != w.Head || !equalCounts(got.Counts, w.Counts) {
		t.Fatalf("round trip: got %+v, want %+v", got, w)
	}
	// Restored into a fresh table, the window decides exactly as before.
	tab2 := newTable(t, 4)
	if err := tab2.Restore("dev", got); err != nil {
		t.Fatal(err)
	}
	for _, at := range []time.Duration{100 * ms, 124 * ms, 125 * ms, 200 * ms} {
		a, b := tab.AllowAt("dev", q, t0.Add(at)), tab2.AllowAt("dev", q, t0.Add(at))
		if a != b {
			t.Fatalf("at +%v: original %+v, restored %+v", at, a, b)
		}
	}
}

func TestRestoreOtherBucketCountIsConservative(t *testing.T) {
	// Saved with 4 buckets, restored into 10: counts must not expire
	// before the original window would have let them.
	src := newTable(t, 4)
	q := Quota{Limit: 3, Window: 100 * ms}
	for i := 0; i < 3; i++ {
		src.AllowAt("dev", q, t0.Add(10*ms))
	}
	w, _ := src.Snapshot("dev")
	dst := newTable(t, 10)
	if err := dst.Restore("dev", w); err != nil {
		t.Fatal(err)
	}
	// In the source the counts leave at 125 ms.
	if d := dst.AllowAt("dev", q, t0.Add(124*ms)); d.Allowed {
		t.Fatalf("restored counts expired early: %+v", d)
	}
	if d := dst.AllowAt("dev", q, t0.Add(200*ms)); !d.Allowed {
		t.Fatalf("restored counts never expired: %+v", d)
	}
}

func TestUnmarshalRejects(t *testing.T) {
	good, _ := Window{Length: time.Second, Head: 42, Counts: []uint32{1, 2, 3}}.MarshalBinary()
	cases := map[string][]byte{
		"empty":        nil,
		"version":      append([]byte{9}, good[1:]...),
		"truncated":    good[:len(good)-1],
		"trailing":     append(append([]byte{}, good...), 0),
		"one count":    {1, 0x80, 0x94, 0xeb, 0xdc, 0x03, 42, 1, 1},
		"zero length":  {1, 0, 42, 2, 0, 0},
		"huge count":   append(append([]byte{}, good[:len(good)-1]...), 0xff, 0xff, 0xff, 0xff, 0x0f),
		"huge buckets": {1, 0x80, 0x94, 0xeb, 0xdc, 0x03, 42, 0xff, 0x7f},
	}
	for name, b := range cases {
		w := Window{Head: 7}
		err := w.UnmarshalBinary(b)
		if !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: got %v, want ErrBadSnapshot", name, err)
		}
		if w.Head != 7 {
			t.Errorf("%s: window changed on error", name)
		}
	}
}

func FuzzUnmarshalWindow(f *testing.F) {
	good, _ := Window{Length: time.Second, Head: 42, Counts: []uint32{1, 2, 3}}.MarshalBinary()
	f.Add(good)
	f.Add([]byte{1, 0, 0, 2, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var w Window
		if err := w.UnmarshalBinary(b); err != nil {
			return
		}
		// Whatever decodes re-encodes to the same bytes and restores.
		again, err := w.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded window does not encode: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %x vs %x", again, b)
		}
		tab, _ := NewTable(len(w.Counts) - 1)
		if err := tab.Restore("dev", w); err != nil {
			t.Fatalf("decoded window does not restore: %v", err)
		}
		tab.AllowAt("dev", Quota{Limit: 1, Window: w.Length}, t0)
	})
}

func equalCounts(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
