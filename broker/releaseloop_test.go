package broker

import (
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// bubbleClock reads the time of the synctest bubble it is used in.
type bubbleClock struct{}

func (bubbleClock) Now() devicelimit.Tick { return devicelimit.TickOf(time.Now()) }

// newLoopDeferrer builds a deferrer without a server or a store, whose
// releases are recorded as "device@offset from start".
func newLoopDeferrer(t *testing.T, clock devicelimit.Clock, start devicelimit.Tick) (*deferrer, *devicelimit.Table, func() []string) {
	t.Helper()
	table, err := devicelimit.NewTable(testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	resolver, err := devicelimit.NewResolver(generous, nil, testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	logs, err := newLogLimiter(clock)
	if err != nil {
		t.Fatal(err)
	}
	d := newDeferrer(nil, DeferLimits{MaxAge: 24 * time.Hour}, &throttle{table: table, limiter: table, resolver: resolver, clock: clock, log: discardLogger, logs: logs, conns: new(registry)})
	var mu sync.Mutex
	var got []string
	d.publish = func(device string, _ *deferredMsg, _ uint32) error {
		mu.Lock()
		got = append(got, fmt.Sprintf("%s@%s", device, clock.Now().Sub(start)))
		mu.Unlock()
		return nil
	}
	return d, table, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// The release loop sleeps until the earliest device is due, wakes at once
// for a device due earlier than that, and otherwise never wakes.
func TestReleaseLoopSleepsUntilDue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := bubbleClock{}
		start := clock.Now()
		d, table, released := newLoopDeferrer(t, clock, start)
		q := devicelimit.Quota{Limit: 1, Window: time.Second, Policy: devicelimit.PolicyDefer}
		table.AllowAt("a", q, start)                   // a's window is full until start+1.1s
		d.queueForTest("a", q, 3, start, start, false) // as restored: the loop has not started

		stop, done := make(chan struct{}), make(chan struct{})
		go func() { defer close(done); d.run(stop) }()
		t.Cleanup(func() { close(stop); <-done })
		check := func(when string, wantWakes uint64, want ...string) {
			t.Helper()
			synctest.Wait()
			if got := released(); !slices.Equal(got, want) {
				t.Fatalf("%s: released %q, want %q", when, got, want)
			}
			if w := d.wakes.Load(); w != wantWakes {
				t.Fatalf("%s: %d wake-ups, want %d", when, w, wantWakes)
			}
		}
		check("at start", 0) // the first round found a's window full
		time.Sleep(1100*time.Millisecond - time.Nanosecond)
		check("just before a is due", 0)
		time.Sleep(time.Nanosecond)
		check("when a is due", 1, "a@1.1s")

		time.Sleep(100 * time.Millisecond)
		d.queueForTest("b", q, 1, clock.Now(), clock.Now(), true) // due now, before a (at 2.2s)
		check("b queued", 2, "a@1.1s", "b@1.2s")

		time.Sleep(time.Hour)
		check("an hour later", 4, "a@1.1s", "b@1.2s", "a@2.2s", "a@3.3s")
		if n := d.queueMsgs.Load(); n != 0 {
			t.Fatalf("%d messages queued", n)
		}
	})
}

// 10,000 devices with messages queued and none due for an hour: the loop
// sleeps through the hour without waking once.
func TestReleaseLoopIdleDevices(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := bubbleClock{}
		start := clock.Now()
		d, table, released := newLoopDeferrer(t, clock, start)
		q := devicelimit.Quota{Limit: 1, Window: time.Hour, Policy: devicelimit.PolicyDefer}
		for i := range 10_000 {
			dev := fmt.Sprintf("dev-%d", i)
			table.AllowAt(dev, q, start)
			d.queueForTest(dev, q, 1, start, start.Add(time.Hour), false)
		}
		stop, done := make(chan struct{}), make(chan struct{})
		go func() { defer close(done); d.run(stop) }()
		t.Cleanup(func() { close(stop); <-done })
		time.Sleep(time.Hour - time.Nanosecond)
		synctest.Wait()
		if w, r, v := d.wakes.Load(), d.rounds.Load(), d.visited.Load(); w != 0 || r != 1 || v != 0 {
			t.Fatalf("within the hour: %d wake-ups, %d rounds, %d devices visited; want 0, 1, 0", w, r, v)
		}
		time.Sleep(7 * time.Minute) // the windows' last bucket ends at 1h6m
		synctest.Wait()
		if n := len(released()); n != 10_000 {
			t.Fatalf("%d released after the hour, want 10000", n)
		}
	})
}

// The same with a real server, store and loop: 10,000 devices restored
// with a message each and full windows. The loop's first round, at
// start, visits each once; after that, release rounds at instants where
// nothing is due visit none, the loop does not wake, and the process
// spends next to no CPU.
func TestDeferIdleDevicesCostNothing(t *testing.T) {
	const devices = 10_000
	store := openStore(t, t.TempDir())
	table, err := devicelimit.NewTable(testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	q := devicelimit.Quota{Limit: 1, Window: time.Hour, Policy: devicelimit.PolicyDefer}
	for i := range devices {
		dev := fmt.Sprintf("dev-%d", i)
		m := deferredMsg{Enqueued: t0, Quota: q, Version: 5, QoS: 1, Topic: "t/" + dev, Payload: []byte("x")}
		if err := store.Enqueue(dev, 1, appendDeferred(nil, &m)); err != nil {
			t.Fatal(err)
		}
		table.AllowAt(dev, q, t0)
	}
	f := start(t, fixtureOpts{store: store, table: table, releaseLoop: true, limits: DeferLimits{MaxAge: 2 * time.Hour}})
	d := f.srv.def
	eventually(t, "the first round", func() bool { return d.visited.Load() == devices })
	if st := f.srv.Stats(); st.QueueMessages != devices || st.Released != 0 {
		t.Fatalf("after the first round: %+v", st)
	}

	wakes := d.wakes.Load()
	before := cpuTime(t)
	wall := time.Now()
	time.Sleep(2 * time.Second) // measuring idle CPU, not letting logical time pass
	used, elapsed := cpuTime(t)-before, time.Since(wall)
	t.Logf("idle with %d devices queued: %s CPU in %s (%.2f%%), %d loop wake-ups",
		devices, used, elapsed.Round(time.Millisecond), 100*used.Seconds()/elapsed.Seconds(), d.wakes.Load()-wakes)
	if w := d.wakes.Load() - wakes; w != 0 {
		t.Fatalf("the loop woke %d times with nothing due", w)
	}
	if used > elapsed/10 {
		t.Fatalf("%s CPU in %s with nothing due", used, elapsed)
	}

	rounds := d.rounds.Load()
	for range 60 {
		f.srv.releaseTick(f.clock.Advance(time.Minute))
	}
	if v, r := d.visited.Load(), d.rounds.Load()-rounds; v != devices || r != 60 {
		t.Fatalf("60 rounds within the hour visited %d devices (%d rounds), want none beyond the first round's %d", v-devices, r, devices)
	}
	f.srv.releaseTick(f.clock.Advance(10 * time.Minute))
	if st := f.srv.Stats(); st.Released != devices || st.QueueMessages != 0 {
		t.Fatalf("after the hour: %+v, want all released", st)
	}
	d.flushDeletes()
	if n, _, err := store.DeferredStats(); err != nil || n != 0 {
		t.Fatalf("%d messages stored after release (%v)", n, err)
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
