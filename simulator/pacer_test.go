package simulator

import (
	"testing"
	"time"
)

// TestPacer steps a pacer through acknowledgements at fixed instants
// t0.. and checks when each path may send next.
func TestPacer(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	p := newPacer()
	p.policies([]RatePolicy{
		{Name: "1m", Quota: 60, Window: time.Minute},
		{Name: "1m-bytes", Quota: 6000, Window: time.Minute, Bytes: true},
		{Name: "alarms/10s", Quota: 2, Window: 10 * time.Second},
		{Name: "group/1m", Quota: 1000, Window: time.Minute},
	})
	steps := []struct {
		now   time.Duration
		path  string
		field string // an acknowledgement's RateLimit; "" for none
		size  int
		want  map[string]time.Duration // path -> ready, offset from t0; -1: no hold
	}{
		// Nothing known yet: every path may go.
		{0, "", "", 100, map[string]time.Duration{"": -1, "alarms": -1}},
		// 59 left, room freed in 60 s: 60 messages in 60 s, one a
		// second; bytes 5900 left, 59 messages of 100 bytes: the same;
		// the group leaves room for more.
		{0, "", `"1m";r=59;t=60, "1m-bytes";r=5900;t=60, "group/1m";r=999;t=60`, 100,
			map[string]time.Duration{"": time.Second, "alarms": -1}},
		// The byte window is the tighter now: 10 messages of 100 bytes
		// and one more in 50 s.
		{time.Second, "", `"1m-bytes";r=1000;t=50, "1m";r=58;t=50, "group/1m";r=998;t=59`, 100,
			map[string]time.Duration{"": time.Second + 50*time.Second/11, "alarms": -1}},
		// A class's message is bounded by the class and the group only.
		{2 * time.Second, "alarms", `"alarms/10s";r=1;t=10, "group/1m";r=997;t=58`, 100,
			map[string]time.Duration{"": time.Second + 50*time.Second/11, "alarms": 7 * time.Second}},
		// Refused in the class: wait the retry-after; the device's own
		// path keeps its pace but the group is shared.
		{3 * time.Second, "alarms", `"alarms/10s";r=0;t=9, "group/1m";r=997;t=57`, 100,
			map[string]time.Duration{"": time.Second + 50*time.Second/11, "alarms": 12 * time.Second}},
		// Fewer bytes left than the message weighs: no room, wait t.
		{6 * time.Second, "", `"1m-bytes";r=50;t=4, "1m";r=57;t=54`, 100,
			map[string]time.Duration{"": 10 * time.Second, "alarms": 12 * time.Second}},
		// An empty window (t=0) holds nothing back; no RateLimit neither.
		{10 * time.Second, "", `"1m";r=60;t=0`, 100, map[string]time.Duration{"": 10 * time.Second, "alarms": 12 * time.Second}},
		{11 * time.Second, "alarms", "", 100, map[string]time.Duration{"": 10 * time.Second, "alarms": -1}},
	}
	for i, st := range steps {
		var items []RateRemaining
		if st.field != "" {
			var err error
			if items, err = ParseRateRemaining(st.field); err != nil {
				t.Fatal(err)
			}
			p.observe(st.path, items, st.size, at(st.now))
		} else if i > 0 {
			p.observe(st.path, nil, st.size, at(st.now))
		}
		for path, want := range st.want {
			got := p.ready(path)
			if want < 0 {
				if !got.IsZero() {
					t.Errorf("step %d: path %q ready at %v, want no hold", i, path, got.Sub(t0))
				}
				continue
			}
			if !got.Equal(at(want)) {
				t.Errorf("step %d: path %q ready at %v, want %v", i, path, got.Sub(t0), want)
			}
		}
	}
}

// A window the policy did not list counts bytes by its name.
func TestPacerBytesByName(t *testing.T) {
	p := newPacer()
	t0 := time.Unix(0, 0)
	p.observe("", []RateRemaining{{Name: "10s-bytes", R: 300, T: 3 * time.Second}}, 100, t0)
	if got, want := p.ready(""), t0.Add(750*time.Millisecond); !got.Equal(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}
