// Package forwardtest runs forwarders for the tests of the destination
// packages (forward/redisstream, forward/natsjs, forward/kafka): over a
// real data file, with short backoffs, and checks what a destination
// received.
package forwardtest

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/devicegate/devicegate/forward"
	"github.com/devicegate/devicegate/internal/poll"
	"github.com/devicegate/devicegate/persist"
)

// Run runs a forwarder named name ("streams/0") dialing d, over a fresh
// data file in the test's directory, until the test ends. Backoffs are
// short, the acknowledgement timeout a second.
func Run(t *testing.T, name string, d forward.Dialer) (*forward.Forwarder, *persist.Store) {
	return RunWith(t, name, d, nil)
}

// RunWith is Run with the configuration changed by set, when not nil.
func RunWith(t *testing.T, name string, d forward.Dialer, set func(*forward.Config)) (*forward.Forwarder, *persist.Store) {
	t.Helper()
	st, err := persist.Open(t.TempDir(), persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cfg := forward.Config{Name: name, Dial: d, MaxQoS: 1, AckTimeout: time.Second,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}
	if set != nil {
		set(&cfg)
	}
	f, err := forward.New(cfg, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return f, st
}

// Append appends messages from to to (their payloads the numbers) of
// each device, on topic "devices/DEVICE/t" at QoS 1, in turn.
func Append(t *testing.T, f *forward.Forwarder, devices []string, from, to int) {
	t.Helper()
	for i := from; i <= to; i++ {
		for _, d := range devices {
			if err := f.Append(&forward.Message{Device: d, Topic: "devices/" + d + "/t", QoS: 1, Payload: []byte(strconv.Itoa(i))}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Backlog returns the messages waiting in forward log name.
func Backlog(t *testing.T, st *persist.Store, name string) int {
	t.Helper()
	n, _, _, _, err := st.ForwardStats(name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// InOrder checks that got, the payloads a destination holds for one
// device in its order, are 1 to n, each first seen after the one before
// (a duplicate may come again later, as one sent again does), and
// returns the number of duplicates.
func InOrder(t *testing.T, device string, got []string, n int) (dups int) {
	t.Helper()
	seen := map[string]bool{}
	next := 1
	for _, p := range got {
		if seen[p] {
			dups++
			continue
		}
		seen[p] = true
		if p != strconv.Itoa(next) {
			t.Fatalf("%s: %q where %d was due: out of order or missing", device, p, next)
		}
		next++
	}
	if next != n+1 {
		t.Fatalf("%s: %d distinct messages, want %d", device, next-1, n)
	}
	return dups
}

// Outage is a destination taken down and brought up again.
type Outage struct {
	Name     string
	Down, Up func()
}

// Outages runs the destination tests' scenario on f (log name over st):
// 100 messages of each device sent, then for each outage 100 more
// appended while the destination is down, which must wait in the log,
// and be sent once it is up again. It returns the messages appended per
// device.
func Outages(t *testing.T, f *forward.Forwarder, st *persist.Store, name string, devices []string, outages ...Outage) int {
	t.Helper()
	backlog := func() int { return Backlog(t, st, name) }
	Append(t, f, devices, 1, 100)
	poll.Until(t, 20*time.Second, "the log sent", func() bool { return backlog() == 0 })
	n := 100
	for _, o := range outages {
		o.Down()
		Append(t, f, devices, n+1, n+100)
		n += 100
		poll.Until(t, 20*time.Second, o.Name+" noticed", func() bool { return !f.Connected() })
		if backlog() == 0 {
			t.Fatalf("nothing waited in the log during %s", o.Name)
		}
		o.Up()
		poll.Until(t, 30*time.Second, "the backlog sent after "+o.Name, func() bool { return backlog() == 0 })
	}
	return n
}

// Refusal is the dead-letter scenario of a destination: Bad's messages
// are refused for good until Fix removes the cause; Read returns what
// the destination holds for a device, in its order.
type Refusal struct {
	Good   []string
	Bad    string
	Reason string // the RefusedError's reason expected
	Fix    func()
	Read   func(device string) []string
	// Payload, when set, makes a device's message i (a too large one,
	// say); the number i otherwise.
	Payload func(device string, i int) []byte
	// Number reads a message's number back from what Read returns.
	Number func(p string) string
	// ReadIDs, when set, returns the IDs of what the destination holds
	// for a device, in its order.
	ReadIDs func(device string) []string
}

// Refused runs the scenario: n messages of every device appended in
// turn, Bad's all refused while the others arrive once each, in order;
// Bad's are then in the dead-letter log, counted by reason; replayed
// after Fix, they arrive in order and the dead-letter log is empty.
func Refused(t *testing.T, f *forward.Forwarder, st *persist.Store, name string, n int, r Refusal) {
	t.Helper()
	number := r.Number
	if number == nil {
		number = func(p string) string { return p }
	}
	all := append(append([]string(nil), r.Good...), r.Bad)
	for i := 1; i <= n; i++ {
		for _, d := range all {
			p := []byte(strconv.Itoa(i))
			if r.Payload != nil {
				p = r.Payload(d, i)
			}
			if err := f.Append(&forward.Message{Device: d, Topic: "devices/" + d + "/t", QoS: 1, Payload: p}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The counts follow the move's commit: waited for too.
	poll.Until(t, 30*time.Second, "the log gone through", func() bool {
		return Backlog(t, st, name) == 0 && f.Stats().DeadByReason[r.Reason] >= uint64(n)
	})
	for _, d := range r.Good {
		var got []string
		for _, p := range r.Read(d) {
			got = append(got, number(p))
		}
		if dups := InOrder(t, d, got, n); dups != 0 {
			t.Fatalf("%s: %d duplicates of messages the destination stored: %v (%d connection attempts, %+v)", d, dups, got, f.Attempts(), f.Stats())
		}
	}
	if got := r.Read(r.Bad); len(got) != 0 {
		t.Fatalf("%s: %d messages stored, want all refused", r.Bad, len(got))
	}
	s := f.Stats()
	if s.DeadLetters != n || s.DeadByReason[r.Reason] != uint64(n) {
		t.Fatalf("stats: %d dead letters, by reason %v; want %d %s", s.DeadLetters, s.DeadByReason, n, r.Reason)
	}
	dead, total, err := f.DeadLetters(-1)
	if err != nil || total != n || len(dead) != n {
		t.Fatalf("dead letters: %d of %d, %v; want %d", len(dead), total, err, n)
	}
	for i, d := range dead {
		if d.Message.Device != r.Bad || d.Reason != r.Reason || d.Error == "" || (i > 0 && d.Seq <= dead[i-1].Seq) {
			t.Fatalf("dead letter %d: %+v", i, d)
		}
	}
	t.Logf("%s refused: %q", r.Bad, dead[0].Error)
	// Replayed before the cause is gone: refused again, back in the
	// dead letters under the IDs they had.
	if m, err := f.ReplayDead(); err != nil || m != n {
		t.Fatalf("replay: %d, %v; want %d", m, err, n)
	}
	poll.Until(t, 30*time.Second, "the replay refused again", func() bool {
		again, total, err := f.DeadLetters(-1)
		return err == nil && total == n && len(again) == n && again[0].Seq != dead[0].Seq && again[n-1].Seq > dead[n-1].Seq
	})
	again, _, _ := f.DeadLetters(-1)
	ids := make([]string, n)
	for i := range again {
		if ids[i] = dead[i].ID; again[i].ID != dead[i].ID {
			t.Fatalf("dead letter %d: ID %q after a replay refused again, %q before", i, again[i].ID, dead[i].ID)
		}
	}
	r.Fix()
	// Two replays at once: each dead letter is sent once, by one of
	// them (before, both sent every one, under new IDs).
	var counts [2]int
	var errs [2]error
	var wg sync.WaitGroup
	for i := range counts {
		wg.Go(func() { counts[i], errs[i] = f.ReplayDead() })
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil || counts[0]+counts[1] != n {
		t.Fatalf("two replays at once: %v %v, %v; want %d in all", counts, errs[0], errs[1], n)
	}
	for deadline := time.Now().Add(30 * time.Second); Backlog(t, st, name) > 0 || len(r.Read(r.Bad)) < n; time.Sleep(10 * time.Millisecond) { // polling the destination
		if time.Now().After(deadline) {
			t.Fatalf("the replay not delivered after 30s: %d of %d stored; %+v", len(r.Read(r.Bad)), n, f.Stats())
		}
	}
	var got []string
	for _, p := range r.Read(r.Bad) {
		got = append(got, number(p))
	}
	if dups := InOrder(t, r.Bad, got, n); dups != 0 {
		t.Fatalf("%s: %d duplicates after two replays at once: %v", r.Bad, dups, got)
	}
	if r.ReadIDs != nil {
		if got := r.ReadIDs(r.Bad); !slices.Equal(got, ids) {
			t.Fatalf("%s: the destination holds the IDs %q, the dead letters were listed as %q", r.Bad, got, ids)
		}
	}
	if s := f.Stats(); s.DeadLetters != 0 {
		t.Fatalf("after the replay: %d dead letters", s.DeadLetters)
	}
}
