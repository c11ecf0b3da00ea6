package forward

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/poll"
)

// TestSetLiveDialAndMaxAge: a forwarder whose destination is down takes
// a new dialer (as new credentials come) at its next attempt, and a
// max age set meanwhile drops the messages already too old when their
// turn comes; the younger ones go. The clock is injected.
func TestSetLiveDialAndMaxAge(t *testing.T) {
	up := mosquittotest.StartWith(t, mosquittotest.Options{})
	sub := subscribe(t, up.Addr, "#")
	var mu sync.Mutex
	now := time.Unix(1_790_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	f, st := runForwarder(t, Config{Name: "up/0", Dial: &MQTT{Address: deadAddr(t), ClientID: "gw"}, MaxQoS: 1, Now: clock,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	for i := 1; i <= 10; i++ {
		if i == 6 {
			mu.Lock()
			now = now.Add(time.Minute) // the first five are a minute older
			mu.Unlock()
		}
		if err := f.Append(msg("devices/d/t", strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.SetLive(Live{Dial: &MQTT{Address: up.Addr, ClientID: "gw"}, MaxAge: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 20*time.Second, "the young five upstream and the log empty", func() bool {
		return sub.firsts(t) == 5 && logLen(t, st) == 0 && f.Stats().Forwarded == 5
	})
	sub.mu.Lock()
	first := sub.got[0]
	sub.mu.Unlock()
	if s := f.Stats(); first != "6" || s.Expired != 5 {
		t.Fatalf("first upstream %q, stats %+v: want 6 first and 5 expired", first, s)
	}
	if err := f.SetLive(Live{}); err == nil {
		t.Fatal("SetLive without a dialer succeeded")
	}
}

// TestSetLiveMaxBytes: a bound set on a running forwarder whose
// destination is down trims its log to the bound at once, oldest first,
// and counts what it dropped.
func TestSetLiveMaxBytes(t *testing.T) {
	dial := &MQTT{Address: deadAddr(t), ClientID: "gw"}
	f, _ := overflowForwarder(t, 0, DropOldest)
	for i := 100; i < 150; i++ {
		if err := f.Append(msg("devices/d/t", strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.SetLive(Live{Dial: dial, MaxBytes: 10 * recordSize}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the log trimmed to the new bound", func() bool { return f.Stats().BacklogBytes <= 10*recordSize })
	if s := f.Stats(); s.Backlog != 10 || s.DroppedOldest != 40 {
		t.Fatalf("backlog %d, dropped %d; want 10 and 40", s.Backlog, s.DroppedOldest)
	}
}

// TestSetLiveRate: a rate raised on a connection that sends a backlog at
// 2 messages a second applies from its next message: 100 messages go
// in far less than the 50 s the old rate takes.
func TestSetLiveRate(t *testing.T) {
	up := mosquittotest.StartWith(t, mosquittotest.Options{})
	sub := subscribe(t, up.Addr, "#")
	dial := &MQTT{Address: up.Addr, ClientID: "gw"}
	f, _ := runForwarder(t, Config{Name: "up/0", Dial: dial, MaxQoS: 1, Rate: 2})
	const n = 100
	for i := 1; i <= n; i++ {
		if err := f.Append(msg("devices/d/t", strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, 10*time.Second, "the first paced message upstream", func() bool { return sub.firsts(t) >= 1 })
	if got := sub.firsts(t); got >= n/2 {
		t.Fatalf("%d of %d upstream at 2/s already: the test cannot tell the rate", got, n)
	}
	start := time.Now()
	if err := f.SetLive(Live{Dial: dial, Rate: 1000}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 20*time.Second, "every message upstream", func() bool { return sub.firsts(t) == n })
	t.Logf("the rest of %d messages upstream %s after the rate went from 2/s to 1000/s", n, time.Since(start).Round(time.Millisecond))
}
