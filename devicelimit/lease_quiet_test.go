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

// A device publishing steadily below its quota asks for its next lease
// right after an admission uses up the last one, so that a lease write
// between its messages has it durable before it is needed: only the
// first admission waits, even at a lease of 1 (5 per 10 s: make
// sim-10k's fleet). Its asks do not wake the writer, which takes such
// early asks at its own pace (persist's Leaser: once a second, here
// five times between two messages). Before, the lease was asked only
// once the window went past it, and every other admission waited for
// a disk commit. The cap never runs more than a lease ahead of the
// admissions the lease write records.
func TestSteadyDeviceWaitsOnlyForItsFirstLease(t *testing.T) {
	tab := newTable(t, 10)
	tab.EnableLeases(DefaultLeasePolicy)
	q := Quota{Limit: 5, Window: 10 * time.Second}
	now := t0
	for i := range 12 {
		d := tab.AllowAt("meter", q, now)
		if !d.Allowed {
			t.Fatalf("admission %d refused", i)
		}
		if (d.Lease != 0) != (i == 0) {
			t.Fatalf("admission %d waits for lease batch %d; want only the first to wait", i, d.Lease)
		}
		if i == 0 {
			select {
			case <-tab.LeaseWake():
			default:
				t.Fatal("the first admission waits and did not wake the writer")
			}
		}
		select {
		case <-tab.LeaseWake():
			t.Fatalf("admission %d woke the writer, want only the first to", i)
		default:
		}
		var leases []Lease
		gen, keys := tab.TakeLeases(func(key string, l Lease) { leases = append(leases, l) })
		if len(leases) != 1 || leases[0].Cap-leases[0].Adm != 1 || leases[0].Adm != uint64(i+1) {
			t.Fatalf("after admission %d: leases %+v, want one of 1 beyond its %d admissions", i, leases, i+1)
		}
		tab.LeasesDurable(gen)
		tab.ReleaseLeaseKeys(keys)
		for range 4 { // the writes until its next message, of others' leases
			gen, keys := tab.TakeLeases(func(string, Lease) {})
			tab.LeasesDurable(gen)
			tab.ReleaseLeaseKeys(keys)
		}
		now = now.Add(5 * time.Second)
	}
}

// A window that asks for its next lease in one of the batches right
// after its previous (it uses a lease faster than the writer's lazy
// writes come) wakes the writer when it asks, before it needs it.
func TestFastDeviceWakesTheWriterEarly(t *testing.T) {
	tab := newTable(t, 10)
	tab.EnableLeases(DefaultLeasePolicy)
	q := Quota{Limit: 100, Window: 10 * time.Second} // a lease of 10
	write := func() {
		gen, keys := tab.TakeLeases(func(string, Lease) {})
		tab.LeasesDurable(gen)
		tab.ReleaseLeaseKeys(keys)
	}
	woke := func() bool {
		select {
		case <-tab.LeaseWake():
			return true
		default:
			return false
		}
	}
	now := t0
	admit := func() Decision {
		now = now.Add(100 * time.Millisecond)
		d := tab.AllowAt("fast", q, now)
		if !d.Allowed {
			t.Fatal("refused")
		}
		return d
	}
	if d := admit(); d.Lease == 0 || !woke() {
		t.Fatalf("first admission %+v: want it waiting for its lease, the writer woken", d)
	}
	write() // cap 11
	for i := 2; i <= 6; i++ {
		if d := admit(); d.Lease != 0 || woke() {
			t.Fatalf("admission %d: %+v, woke the writer: want neither (its lease has more than half left)", i, d)
		}
	}
	// The 7th leaves 4 of 10: it asks for the next, one batch after its first.
	if d := admit(); d.Lease != 0 || !woke() {
		t.Fatalf("admission 7 %+v: want admitted under its lease, and its next asked at once", d)
	}
}

// A window that asks for leases twice before they are written is
// written once, with the later cap.
func TestLeaseAskedTwiceWrittenOnce(t *testing.T) {
	tab := newTable(t, 10)
	tab.EnableLeases(DefaultLeasePolicy)
	q := Quota{Limit: 5, Window: 10 * time.Second}
	for i := range 3 { // caps 2, then 4 (a lease of 1 beyond 3)
		if d := tab.AllowAt("meter", q, t0.Add(time.Duration(i)*time.Millisecond)); !d.Allowed || d.Lease == 0 {
			t.Fatalf("admission %d: %+v, want admitted, waiting for its lease", i, d)
		}
	}
	var caps []uint64
	tab.TakeLeases(func(key string, l Lease) { caps = append(caps, l.Cap) })
	if len(caps) != 1 || caps[0] != 4 {
		t.Fatalf("lease writes of caps %v, want one of 4", caps)
	}
}

// A window's lease closes after two of its lengths without an
// admission once the table knows how often it is collected, between
// idleCollects and maxIdleCollects collections; without the interval,
// after idleCollects. Collected once a second here: a window of 1 s
// closes at the 10th idle collection, one of 10 s at the 20th, one of an
// hour at the 60th.
func TestIdleLeaseClosesAfterTwoLengths(t *testing.T) {
	for _, tc := range []struct {
		every time.Duration
		want  map[time.Duration]int
	}{
		{time.Second, map[time.Duration]int{time.Second: 10, 10 * time.Second: 20, time.Hour: 60}},
		{0, map[time.Duration]int{time.Second: 10, 10 * time.Second: 10, time.Hour: 10}},
	} {
		tab := newTable(t, 10)
		tab.EnableLeases(DefaultLeasePolicy)
		if tc.every > 0 {
			tab.SetCollectInterval(tc.every)
		}
		device := map[string]time.Duration{}
		closedAt := map[time.Duration]int{}
		tab.CollectLeases(func(string, []byte, LeaseMark) {}) // the first collection
		for length := range tc.want {
			key := "dev-" + length.String()
			device[key] = length
			if d := tab.AllowAt(key, Quota{Limit: 100, Window: length}, t0); !d.Allowed {
				t.Fatalf("%s refused", key)
			}
		}
		// The collection right after the admissions hands them out; the
		// idle ones count from the next.
		tab.CollectLeases(func(string, []byte, LeaseMark) {})
		for i := 1; i <= maxIdleCollects+1; i++ {
			tab.CollectLeases(func(key string, enc []byte, m LeaseMark) {
				if enc != nil && m.Inc != 0 {
					closedAt[device[key]] = i
				}
			})
		}
		for length, want := range tc.want {
			if closedAt[length] != want {
				t.Errorf("collected every %v: the lease of a window of %v closed at idle collection %d, want %d", tc.every, length, closedAt[length], want)
			}
		}
	}
}
