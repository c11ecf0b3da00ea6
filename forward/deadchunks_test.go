package forward

import (
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/poll"
	"github.com/devicegate/devicegate/persist"
)

// fillDead makes messages 1 to n of forward log name (device "dev-K"
// for K = n mod 100, topic devices/dead/t) its dead letters, refused,
// in a few transactions: a group commit appends them, one transaction
// moves them.
func fillDead(t *testing.T, st *persist.Store, name string, n int) {
	t.Helper()
	waits := make([]persist.Queued, 0, n)
	seqs := make([]uint64, 0, n)
	entries := make([][]byte, 0, n)
	for seq := uint64(1); seq <= uint64(n); seq++ {
		m := Message{Device: "dev-" + strconv.FormatUint(seq%100, 10), At: time.Now(), Topic: "devices/dead/t", QoS: 1, Payload: []byte(strconv.FormatUint(seq, 10))}
		rec := appendRecord(nil, &m)
		seal(rec, seq)
		w, err := st.AppendForwardAsync(name, seq, rec)
		if err != nil {
			t.Fatal(err)
		}
		waits = append(waits, w)
		seqs = append(seqs, seq)
		entries = append(entries, appendDead(nil, time.Now(), "not_authorized", "refused", rec))
	}
	for _, w := range waits {
		if err := w.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.MoveForwardDeadMany(name, seqs, entries, MaxDeadLetters); err != nil {
		t.Fatal(err)
	}
}

// TestReplayDoesNotStallForwarder: a replay of an upstream's 100,000
// dead letters (10 connections of 10,000, the most each holds) runs
// while one connection's real upstream (Mosquitto over MQTT 5, whose
// ACL denies one topic) refuses a message, followed by one it takes:
// the forwarder's move of the refused message to the dead letters, and
// its sending of the next one, complete before the replay ends (they
// wait for one chunk of it, not the whole). Asserted on order, not on
// milliseconds: the replay takes 100 chunks, the move waits for at most
// one. The replay replays those present when it started: the refused
// message stays a dead letter; the move dropped its log's oldest dead
// letter for room (the log was full) before the replay reached it, and
// the replay skips it. Every other dead letter is replayed once, in its
// log's order. Before, the move waited for the whole replay.
func TestReplayDoesNotStallForwarder(t *testing.T) {
	const logs, each = 10, MaxDeadLetters
	up := mosquittotest.StartWith(t, mosquittotest.Options{ACL: "topic readwrite #\ntopic deny devices/bad/t\n", MaxQueued: 100000})
	sub := subscribe(t, up.Addr, "devices/good/t")
	st, err := persist.Open(t.TempDir(), persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var fs []*Forwarder
	for i := range logs {
		name := "up/" + strconv.Itoa(i)
		fillDead(t, st, name, each)
		if i < logs-1 {
			fs = append(fs, idle(t, st, name))
		}
	}
	last := "up/" + strconv.Itoa(logs-1) // replayed last (name order)
	f := startForwarder(t, Config{Name: last, Dial: &MQTT{Address: up.Addr, ClientID: "gw-stall", V5: true},
		MaxQoS: 1, AckTimeout: 5 * time.Second, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}, st, nil)
	fs = append(fs, f)
	poll.Until(t, 10*time.Second, "the upstream connection", f.Connected)

	type end struct {
		n              int
		err            error
		at             time.Time
		moved, sentOne bool // the refused message moved, the next one acknowledged, when the replay returned
	}
	done := make(chan end, 1)
	started := time.Now()
	go func() {
		n, err := ReplayDeadOf(fs, nil)
		done <- end{n: n, err: err, at: time.Now(), moved: f.Stats().DeadByReason["not_authorized"] == 1, sentOne: f.Forwarded() >= 1}
	}()
	// Once the replay has appended to the first log, it runs: the
	// forwarder then gets a message refused, and one taken.
	poll.Until(t, 60*time.Second, "the replay under way", func() bool {
		n, _, _, _, err := st.ForwardStats("up/0")
		return err == nil && n > 0
	})
	appended := time.Now()
	for _, m := range []Message{{Device: "bad", Topic: "devices/bad/t", QoS: 1, Payload: []byte("bad")},
		{Device: "good", Topic: "devices/good/t", QoS: 1, Payload: []byte("good")}} {
		if err := f.Append(&m); err != nil {
			t.Fatal(err)
		}
	}
	var movedAt atomic.Pointer[time.Time]
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for !isClosed(stop) {
			if f.Stats().DeadByReason["not_authorized"] == 1 {
				now := time.Now()
				movedAt.Store(&now)
				return
			}
			time.Sleep(time.Millisecond) // polling the forwarder
		}
	}()
	var e end
	select {
	case e = <-done:
	case <-time.After(5 * time.Minute):
		t.Fatal("the replay of 100,000 dead letters did not end within 5 minutes")
	}
	poll.Until(t, 30*time.Second, "the refused message moved", func() bool { return movedAt.Load() != nil })
	moveWait := movedAt.Load().Sub(appended)
	t.Logf("replay of %d dead letters: %s; the forwarder's move of a refused message %s after it was appended (%s into the replay)",
		logs*each, e.at.Sub(started), moveWait, appended.Sub(started))
	if !e.moved || !e.sentOne {
		t.Fatalf("when the replay ended (after %s), the refused message moved: %v, the next one acknowledged: %v; want both: the move waits for one chunk, not the replay (it took %s)",
			e.at.Sub(started), e.moved, e.sentOne, moveWait)
	}
	if dropped := int(f.Stats().DeadDropped); e.err != nil || e.n+dropped != logs*each || dropped > 1 {
		t.Fatalf("replay: %d, %v, %d dropped for room; want %d replayed and dropped, at most 1 dropped", e.n, e.err, dropped, logs*each)
	}
	for i, g := range fs {
		left, _, err := g.DeadLetters(-1)
		want := 0
		if g == f {
			want = 1
		}
		if err != nil || len(left) != want || (want == 1 && left[0].Message.Device != "bad") {
			t.Fatalf("%s: dead letters %v (%v); want %d (the refused message, after the start)", g.Name(), left, err, want)
		}
		if g == f {
			continue // its replayed messages leave for the upstream
		}
		ids := forwardIDs(t, st, g.Name())
		want1 := make([]string, each)
		for k := range want1 {
			want1[k] = g.Name() + "/" + strconv.Itoa(k+1)
		}
		if !slices.Equal(ids, want1) {
			t.Fatalf("log %d holds %d messages; want its %d dead letters once each, in order", i, len(ids), each)
		}
	}
	poll.Until(t, 30*time.Second, "the next message at the upstream", func() bool {
		sub.mu.Lock()
		defer sub.mu.Unlock()
		return slices.Equal(sub.got, []string{"good"})
	})
}

// TestReplayAllInChunksAtOnce: two replays of all of a log's 2,500 dead
// letters (three chunks each) and 50 drops of single IDs, all at once:
// each dead letter is replayed once or dropped, never both; the
// replayed ones are in the forward log in their order; a drop answers 1
// or, the dead letter replayed before it, the not-found answer naming
// its ID; nothing is left.
func TestReplayAllInChunksAtOnce(t *testing.T) {
	st, err := persist.Open(t.TempDir(), persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	const n = 2*deadChunk + deadChunk/2
	fillDead(t, st, "up/0", n)
	f := idle(t, st, "up/0")
	var replayed [2]int
	dropped := make([]bool, n+1)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range replayed {
		wg.Go(func() {
			<-start
			var err error
			if replayed[i], err = f.ReplayDead(); err != nil {
				t.Error(err)
			}
		})
	}
	for k := 1; k <= n; k += n / 50 {
		id := "up/0/" + strconv.Itoa(k)
		wg.Go(func() {
			<-start
			d, err := f.DropDead(id)
			none, ok := errors.AsType[*NoDeadError](err)
			switch {
			case d == 1 && err == nil:
				dropped[k] = true
			case d != 0 || !ok || !slices.Equal(none.IDs, []string{id}):
				t.Errorf("drop %s during the replays: %d, %v; want 1, or 0 and no dead letter %q", id, d, err, id)
			}
		})
	}
	close(start)
	wg.Wait()
	var want []string
	for k := 1; k <= n; k++ {
		if !dropped[k] {
			want = append(want, "up/0/"+strconv.Itoa(k))
		}
	}
	got := forwardIDs(t, st, "up/0")
	if !slices.Equal(got, want) || replayed[0]+replayed[1] != len(want) {
		t.Fatalf("replays said %v; forward log holds %d messages; want the %d not dropped, once each, in order", replayed, len(got), len(want))
	}
	if held, err := st.DeadCount("up/0"); err != nil || held != 0 || f.Stats().DeadLetters != 0 {
		t.Fatalf("%d dead letters left (%v), %d counted; want none", held, err, f.Stats().DeadLetters)
	}
}
