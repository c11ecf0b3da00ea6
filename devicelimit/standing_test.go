package devicelimit

import (
	"testing"
	"time"
)

// standingOne returns the standing of dev's own windows under q.
func standingOne(tab *Table, q Quota, size int, refused bool, at time.Duration) Standing {
	var s Standing
	tab.StandingAt("dev", "", q, "", Quota{}, size, refused, t0.Add(at), &s)
	return s
}

func TestStandingSteps(t *testing.T) {
	tab := newTable(t, 4) // q3: 3 per 100 ms, buckets of 25 ms
	type want struct {
		r int
		t time.Duration
	}
	steps := []struct {
		at      time.Duration
		publish bool
		want    want
	}{
		{0, false, want{3, 0}},             // empty: the full quota, t = 0
		{0, true, want{2, 125 * ms}},       // bucket 0 leaves the window at 125 ms
		{10 * ms, true, want{1, 115 * ms}}, // the oldest count is still bucket 0's
		{20 * ms, true, want{0, 105 * ms}},
		{30 * ms, true, want{0, 95 * ms}}, // refused: t is its retry-after
		{125 * ms, false, want{3, 0}},     // all three expired together
		{130 * ms, true, want{2, 120 * ms}},
	}
	for i, st := range steps {
		refused := false
		if st.publish {
			d := tab.AllowAt("dev", q3, t0.Add(st.at))
			refused = !d.Allowed
			if refused && d.RetryAfter != st.want.t {
				t.Fatalf("step %d: retry-after %v, want %v", i, d.RetryAfter, st.want.t)
			}
		}
		s := standingOne(tab, q3, 0, refused, st.at)
		if s.N != 1 {
			t.Fatalf("step %d: %d windows, want 1", i, s.N)
		}
		w := s.Windows[0]
		if got := (want{w.Remaining, w.Reset}); got != st.want {
			t.Fatalf("step %d at t0+%v: got r=%d t=%v, want r=%d t=%v", i, st.at, got.r, got.t, st.want.r, st.want.t)
		}
		if w.Limit != (Limit{Unit: Messages, N: 3, Window: 100 * ms}) || w.Class != "" || w.Group || w.Shadow {
			t.Fatalf("step %d: window %+v", i, w)
		}
	}
}

func TestStandingClassBytesGroup(t *testing.T) {
	tab := newTable(t, 10)
	q := WithWindows(PolicyDrop, Limit{Messages, 4, time.Second}, Limit{Bytes, 100, time.Second})
	gq := Quota{Limit: 10, Window: time.Minute, Shadow: true}
	gk := GroupKey("acme")
	for range 2 {
		if d := tab.AllowGroupAt("dev", "tele", q, gk, gq, 40, t0); !d.Allowed {
			t.Fatalf("refused: %+v", d)
		}
	}
	// 80 of 100 bytes, 2 of 4 messages, 2 of 10 in the group. A message
	// of 30 bytes is refused by the byte window, which admits it once
	// the first bucket (both messages) leaves, at t0+1s+100ms.
	now := t0.Add(300 * ms)
	d := tab.AllowGroupAt("dev", "tele", q, gk, gq, 30, now)
	if d.Allowed || d.Unit != Bytes {
		t.Fatalf("got %+v, want refused by the byte window", d)
	}
	var s Standing
	tab.StandingAt("dev", "tele", q, gk, gq, 30, true, now, &s)
	want := []WindowStanding{
		{Class: "tele", Limit: Limit{Bytes, 100, time.Second}, Remaining: 20, Reset: 800 * ms},
		{Class: "tele", Limit: Limit{Messages, 4, time.Second}, Remaining: 2, Reset: 800 * ms},
		{Group: true, Shadow: true, Limit: Limit{Messages, 10, time.Minute}, Remaining: 8, Reset: 63*time.Second + 700*ms}, // t0 is 2 s into a 6 s bucket,
	}
	if s.N != len(want) {
		t.Fatalf("got %d windows, want %d: %+v", s.N, len(want), s.Windows[:s.N])
	}
	for i := range want {
		if s.Windows[i] != want[i] {
			t.Fatalf("window %d: got %+v, want %+v", i, s.Windows[i], want[i])
		}
	}
	if d.RetryAfter != s.Windows[0].Reset {
		t.Fatalf("the refusing window's t %v is not the decision's retry-after %v", s.Windows[0].Reset, d.RetryAfter)
	}
	// A message of 10 bytes fits: the byte window says when it frees room.
	tab.StandingAt("dev", "tele", q, gk, gq, 10, false, now, &s)
	if s.Windows[0].Reset != 800*ms {
		t.Fatalf("got %+v", s.Windows[0])
	}
	b := s.AppendRateLimit(nil)
	if got, want := string(b), `"tele/1s-bytes";r=20;t=1, "tele/1s";r=2;t=1, "group/1m";r=8;t=64;shadow`; got != want {
		t.Fatalf("RateLimit:\n got %s\nwant %s", got, want)
	}
}

func TestStandingTooLargeAndReadOnly(t *testing.T) {
	tab := newTable(t, 10)
	q := WithWindows(PolicyDrop, Limit{Bytes, 100, time.Second})
	tab.AllowQuotaAt("dev", q, 50, t0)
	var s Standing
	tab.StandingAt("dev", "", q, "", Quota{}, 500, true, t0.Add(ms), &s)
	if w := s.Windows[0]; w.Remaining != 50 || w.Reset != time.Second+100*ms-ms {
		t.Fatalf("a too large message: got %+v, want r=50 and t when room frees", w)
	}
	// Under another window length the look re-cuts a copy only.
	q2 := WithWindows(PolicyDrop, Limit{Bytes, 100, 2 * time.Second})
	tab.StandingAt("dev", "", q2, "", Quota{}, 0, false, t0.Add(ms), &s)
	if d := tab.AllowQuotaAt("dev", q, 50, t0.Add(2*ms)); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after a look under another length: %+v", d)
	}
}

func TestStandingSortAndBelow(t *testing.T) {
	var s Standing
	for _, w := range []WindowStanding{
		{Limit: Limit{N: 100}, Remaining: 50},
		{Limit: Limit{N: 10}, Remaining: 2, Class: "a"},
		{Limit: Limit{N: 1000}, Remaining: 200, Class: "b"},
		{Limit: Limit{N: 4}, Remaining: 3},
	} {
		s.Add(w)
	}
	s.Sort()
	got := ""
	for _, w := range s.Windows[:s.N] {
		got += w.Class + "|"
	}
	if got != "a|b|||" || s.Windows[2].Remaining != 50 {
		t.Fatalf("order %q (%+v)", got, s.Windows[:s.N])
	}
	if !s.Below(21) || s.Below(20) {
		t.Fatal("Below: the tightest window has 20 % left")
	}
}

func TestStandingAllocatesNothing(t *testing.T) {
	tab := newTable(t, 20)
	q := WithWindows(PolicyDrop, Limit{Messages, 100, 10 * time.Second}, Limit{Bytes, 65536, 10 * time.Second})
	gq := Quota{Limit: 1000, Window: time.Minute}
	gk := GroupKey("acme")
	cs := []Class{{Name: "telemetry", Topics: []string{"t/#"}, Quota: Quota{Limit: 30, Window: time.Minute}}}
	tab.AllowGroupAt("dev", "", q, gk, gq, 10, t0)
	var s Standing
	buf := make([]byte, 0, 512)
	n := testing.AllocsPerRun(1000, func() {
		tab.AllowGroupAt("dev", "", q, gk, gq, 10, t0)
		tab.StandingAt("dev", "", q, gk, gq, 10, false, t0, &s)
		buf = s.AppendRateLimit(buf[:0])
		buf = AppendPolicy(buf[:0], q, cs, &gq)
	})
	if n != 0 {
		t.Fatalf("%v allocations per message, want 0", n)
	}
}
