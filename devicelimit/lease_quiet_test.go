package devicelimit

import (
	"testing"
	"time"
)

// A quiet device's window is written when it publishes, not at every
// snapshot while its lease is open: a collection hands it out after an
// admission (without a mark: its lease writes bound its charge), skips
// it while it admits nothing, and hands it out once more when its lease
// closes, with the mark that records the whole lease.
func TestQuietLeaseWrittenOnlyWhenItChanges(t *testing.T) {
	tab := newTable(t, 10)
	tab.EnableLeases(DefaultLeasePolicy)
	tab.lease.idleAfter = 4
	q := Quota{Limit: 100, Window: time.Minute}
	collect := func() (n int, m LeaseMark) {
		tab.CollectLeases(func(key string, enc []byte, mark LeaseMark) {
			if key == "quiet" && enc != nil {
				n, m = n+1, mark
			}
		})
		return n, m
	}
	collect() // the table's first collection
	if d := tab.AllowAt("quiet", q, t0); !d.Allowed {
		t.Fatal("refused")
	}
	var handed []int
	var last LeaseMark
	for i := range 6 {
		n, m := collect()
		handed = append(handed, n)
		if n > 0 {
			last = m
		}
		if i == 0 && (n != 1 || m != (LeaseMark{})) {
			t.Fatalf("after its admission: handed out %d times, mark %+v; want once, without a mark (its lease is open)", n, m)
		}
	}
	// Handed out after the admission, then not while idle, then once
	// when the 4th idle collection closes the lease.
	want := []int{1, 0, 0, 0, 1, 0}
	for i := range want {
		if handed[i] != want[i] {
			t.Fatalf("collections handed the quiet window out %v times, want %v", handed, want)
		}
	}
	if last.Recorded != 11 {
		t.Fatalf("the closing mark records %d, want its cap (11: the admission and its lease of 10)", last.Recorded)
	}
	// An admission after it is handed out again.
	if d := tab.AllowAt("quiet", q, t0.Add(time.Second)); !d.Allowed {
		t.Fatal("refused")
	}
	if n, _ := collect(); n != 1 {
		t.Fatalf("after a new admission handed out %d times, want 1", n)
	}
}
