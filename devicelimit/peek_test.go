package devicelimit

import (
	"reflect"
	"testing"
	"time"
)

// TestPeekChangesNothing: PeekAt computes on a copy. A peek under
// another window length (an operator's GET of a device whose quota
// changed), later in time, and under a limit that needs wider counters, leaves the window exactly as it was, and the
// decisions that follow are those of a table nobody peeked at.
func TestPeekChangesNothing(t *testing.T) {
	q := Quota{Limit: 10, Window: 10 * time.Second}
	start := TickOf(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	peeked, plain := mustTable(t, 20), mustTable(t, 20)
	for _, tb := range []*Table{peeked, plain} {
		for i := range 6 {
			tb.AllowAt("dev", q, start.Add(time.Duration(i)*time.Second))
		}
	}
	before, _ := peeked.Snapshot("dev")
	for _, p := range []struct {
		q  Quota
		at time.Duration
	}{
		{Quota{Limit: 10, Window: time.Minute}, 8 * time.Second},
		{Quota{Limit: 100000, Window: 10 * time.Second}, 12 * time.Second},
		{q, 30 * time.Second},
	} {
		d := peeked.PeekAt("dev", p.q, start.Add(p.at))
		if d.Allowed {
			t.Fatalf("peek %+v at %v: allowed; a peek never admits", p.q, p.at)
		}
		if after, _ := peeked.Snapshot("dev"); !reflect.DeepEqual(after, before) {
			t.Fatalf("peek %+v at %v changed the window:\nbefore %+v\nafter  %+v", p.q, p.at, before, after)
		}
	}
	for i := range 12 {
		now := start.Add(8*time.Second + time.Duration(i)*500*time.Millisecond)
		if a, b := peeked.AllowAt("dev", q, now), plain.AllowAt("dev", q, now); a != b {
			t.Fatalf("at %v: %+v after peeks, %+v without", now.Sub(start), a, b)
		}
	}
}

func mustTable(t *testing.T, buckets int) *Table {
	t.Helper()
	tb, err := NewTable(buckets)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}
