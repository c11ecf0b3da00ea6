package forward

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/poll"
)

// TestMaxAge: messages older than MaxAge when their turn comes (the
// upstream was away) are dropped and counted, never sent; younger ones
// go. The clock is injected.
func TestMaxAge(t *testing.T) {
	up := mosquittotest.StartWith(t, mosquittotest.Options{Persist: true})
	sub := subscribe(t, up.Addr, "#")
	up.Stop()
	var mu sync.Mutex
	now := time.Unix(1_790_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	f, st := runForwarder(t, Config{Name: "up/0", Dial: &MQTT{Address: up.Addr, ClientID: "gw"}, MaxQoS: 1, MaxAge: time.Minute, Now: clock,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	for i := 1; i <= 5; i++ {
		if err := f.Append(msg("devices/d/t", strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	now = now.Add(50 * time.Second)
	mu.Unlock()
	if age := f.Stats().OldestAge; age != 50*time.Second {
		t.Fatalf("oldest age %s, want 50s", age)
	}
	for i := 6; i <= 10; i++ {
		if err := f.Append(msg("devices/d/t", strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	now = now.Add(11 * time.Second) // the first five are 61 s old, the others 11 s
	mu.Unlock()
	up.Restart()
	// The counters follow the deletion: wait for them too.
	poll.Until(t, 20*time.Second, "the young five upstream and the log empty", func() bool {
		return sub.firsts(t) == 5 && logLen(t, st) == 0 && f.Stats().Forwarded == 5
	})
	sub.mu.Lock()
	first := sub.got[0]
	sub.mu.Unlock()
	if s := f.Stats(); first != "6" || s.Expired != 5 || s.Forwarded != 5 || s.Backlog != 0 || s.OldestAge != 0 {
		t.Fatalf("first upstream %q, stats %+v: want 6 first, 5 expired, 5 forwarded", first, s)
	}
}

// TestRate: a forwarder paced to 200 messages/s takes at least as long
// as the rate allows (less the burst of a tenth of a second) to send a
// backlog of 300, and an unpaced one is faster than that.
func TestRate(t *testing.T) {
	up := mosquittotest.StartWith(t, mosquittotest.Options{Persist: true})
	const n, rate = 300, 200.0
	took := func(name string, r float64) time.Duration {
		sub := subscribe(t, up.Addr, name+"/#")
		up.Stop()
		f, _ := runForwarder(t, Config{Name: name + "/0", Dial: &MQTT{Address: up.Addr, ClientID: name}, MaxQoS: 1, Rate: r,
			MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
		for i := 1; i <= n; i++ {
			if err := f.Append(msg(name+"/t", strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		up.Restart()
		poll.Until(t, 20*time.Second, name+": every message upstream", func() bool { return sub.firsts(t) == n })
		return time.Since(start)
	}
	paced := took("paced", rate)
	minimum := time.Duration(float64(n-rate/10) / rate * float64(time.Second))
	if paced < minimum {
		t.Fatalf("%d messages at %g/s took %s, want at least %s", n, rate, paced, minimum)
	}
	if free := took("free", 0); free >= minimum {
		t.Fatalf("unpaced: %s, want less than %s (the test cannot tell pacing)", free, minimum)
	}
	t.Logf("%d messages: paced at %g/s %s (at least %s)", n, rate, paced, minimum)
}
