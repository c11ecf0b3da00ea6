package forward

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/devicegate/devicegate/persist"
)

// deadLog fills forward log name of st with n messages and moves them
// all to its dead letters, as refusals would; the message of number
// again (0: none) is stored as a replay refused again would leave it:
// under number n+1, with the ID of number again.
func deadLog(t *testing.T, st *persist.Store, name string, n int, again uint64) {
	t.Helper()
	for seq := uint64(1); seq <= uint64(n); seq++ {
		m := Message{Device: "dev-" + strconv.FormatUint(seq, 10), At: time.Now(), Topic: "devices/t", QoS: 1, Payload: []byte("p")}
		key := seq
		if seq == again {
			m.ID, key = name+"/"+strconv.FormatUint(seq, 10), uint64(n)+1
		}
		rec := appendRecord(nil, &m)
		seal(rec, key)
		if err := st.AppendForward(name, key, rec); err != nil {
			t.Fatal(err)
		}
		if _, err := st.MoveForwardDead(name, key, appendDead(nil, time.Now(), "not_authorized", "refused", rec), MaxDeadLetters); err != nil {
			t.Fatal(err)
		}
	}
}

// idle returns a forwarder of log name whose upstream never answers
// (nothing listens on port 1 of loopback): what it appends stays.
func idle(t *testing.T, st Log, name string) *Forwarder {
	return startForwarder(t, Config{Name: name, Dial: &MQTT{Address: "127.0.0.1:1", ClientID: "gw-" + name},
		MaxQoS: 1, AckTimeout: time.Second, MinBackoff: time.Hour, MaxBackoff: time.Hour}, st, nil)
}

// forwardIDs returns the IDs of the messages forward log name holds, in
// order.
func forwardIDs(t *testing.T, st *persist.Store, name string) []string {
	t.Helper()
	var ids []string
	if err := st.ReadForward(name, 0, func(seq uint64, rec []byte) bool {
		m, err := decodeRecord(rec)
		if err != nil {
			t.Fatalf("record %d: %v", seq, err)
		}
		ids = append(ids, m.ID)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestDeadOperatorsAtOnce: two operators act on the same dead letter at
// once (a replay and a drop, two drops, two replays), for every dead
// letter of a log, all started together: for each, exactly one says it
// did it (1) and the other gets the not-found answer naming the ID; a
// replayed one is in the forward log once, under its ID; none is left
// behind. One of them was replayed and refused before (its ID names
// another number than its key). Before, the loser answered 0 without
// an error (the API's 200 with "replayed": 0), though its ID had been
// found a moment before.
func TestDeadOperatorsAtOnce(t *testing.T) {
	st, err := persist.Open(t.TempDir(), persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	const n = 30
	deadLog(t, st, "up/0", n, 4)
	f := idle(t, st, "up/0")
	ops := [][2]string{{"replay", "drop"}, {"drop", "drop"}, {"replay", "replay"}}
	type result struct {
		n   int
		err error
	}
	results := make([][2]result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		id := "up/0/" + strconv.Itoa(i+1)
		for j, op := range ops[i%len(ops)] {
			wg.Go(func() {
				<-start
				if op == "replay" {
					results[i][j].n, results[i][j].err = f.ReplayDead(id)
				} else {
					results[i][j].n, results[i][j].err = f.DropDead(id)
				}
			})
		}
	}
	close(start)
	wg.Wait()
	var replayed []string
	for i, r := range results {
		id := "up/0/" + strconv.Itoa(i+1)
		won := slices.IndexFunc(r[:], func(r result) bool { return r.n == 1 && r.err == nil })
		if won < 0 {
			t.Fatalf("%s (%v): %+v; want one to do it", id, ops[i%len(ops)], r)
		}
		lost := r[1-won]
		none, ok := errors.AsType[*NoDeadError](lost.err)
		if lost.n != 0 || !ok || !slices.Equal(none.IDs, []string{id}) || !strings.Contains(lost.err.Error(), strconv.Quote(id)) {
			t.Fatalf("%s (%v): the other answered %d, %v; want 0 and no dead letter %q", id, ops[i%len(ops)], lost.n, lost.err, id)
		}
		if ops[i%len(ops)][won] == "replay" {
			replayed = append(replayed, id)
		}
	}
	got := forwardIDs(t, st, "up/0")
	slices.Sort(got)
	slices.Sort(replayed)
	if !slices.Equal(got, replayed) {
		t.Fatalf("forward log holds %v; want the replayed %v, once each", got, replayed)
	}
	if held, err := st.DeadCount("up/0"); err != nil || held != 0 || f.Stats().DeadLetters != 0 {
		t.Fatalf("%d dead letters left (%v), %d counted; want none", held, err, f.Stats().DeadLetters)
	}
}

// TestDeadAcrossLogs: an upstream's two logs answer as one: a drop or
// replay naming an ID that neither holds changes nothing in either and
// names that ID alone; named right, it acts in both. A dead letter is
// found by its ID whether the ID names its key, or it was replayed and
// refused again before the start (read at New) or while running.
func TestDeadAcrossLogs(t *testing.T) {
	st, err := persist.Open(t.TempDir(), persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	deadLog(t, st, "up/0", 5, 2) // up/0/2 under key 6
	deadLog(t, st, "up/1", 5, 0)
	fs := []*Forwarder{idle(t, st, "up/0"), idle(t, st, "up/1")}
	// Refused again while running: up/1/9's message under key 6.
	if err := fs[1].Append(&Message{Device: "dev-9", Topic: "devices/t", QoS: 1, Payload: []byte("p"), ID: "up/1/9"}); err != nil {
		t.Fatal(err)
	}
	if err := fs[1].deadLetter(6, &RefusedError{Reason: "not_authorized", Err: errors.New("refused")}); err != nil {
		t.Fatal(err)
	}
	held := func() [2]int {
		var n [2]int
		for i, f := range fs {
			_, n[i], _ = f.DeadLetters(0)
		}
		return n
	}
	for _, op := range []func([]*Forwarder, []string) (int, error){DropDeadOf, ReplayDeadOf} {
		n, err := op(fs, []string{"up/0/2", "up/1/9", "nope", "up/1/3", "up/0/6", "nope"})
		none, ok := errors.AsType[*NoDeadError](err)
		if n != 0 || !ok || !slices.Equal(none.IDs, []string{"nope", "up/0/6"}) {
			t.Fatalf("with IDs no log holds: %d, %v; want 0 and the two IDs", n, err)
		}
		if got := held(); got != [2]int{5, 6} {
			t.Fatalf("after the refusal %v are held; want all (5 and 6)", got)
		}
	}
	if n, err := ReplayDeadOf(fs, []string{"up/0/2", "up/1/9", "up/1/3"}); n != 3 || err != nil {
		t.Fatalf("replay: %d, %v; want 3", n, err)
	}
	if got, want := forwardIDs(t, st, "up/1"), []string{"up/1/3", "up/1/9"}; !slices.Equal(got, want) {
		t.Fatalf("up/1 holds %v, want %v", got, want)
	}
	if got, want := forwardIDs(t, st, "up/0"), []string{"up/0/2"}; !slices.Equal(got, want) {
		t.Fatalf("up/0 holds %v, want %v", got, want)
	}
	if n, err := DropDeadOf(fs, []string{"up/0/1", "up/1/5"}); n != 2 || err != nil || held() != [2]int{3, 3} {
		t.Fatalf("drop: %d, %v, %v held; want 2, then 3 and 3", n, err, held())
	}
	if n, err := DropDeadOf(fs, nil); n != 6 || err != nil || held() != [2]int{0, 0} {
		t.Fatalf("drop all: %d, %v, %v held; want 6, then none", n, err, held())
	}
}

// deadDeleteFails is a data file whose deletions of dead letters fail,
// as a crash between a replay's append and its deletion would leave it.
type deadDeleteFails struct{ *persist.Store }

func (deadDeleteFails) DeleteDead(string, []uint64) error { return errors.New("crashed") }

// TestReplayOneTransaction: a replayed dead letter leaves the dead
// letters in the transaction that appends it to the forward log, so no
// moment (a crash) finds it in both: with the dead letters' own
// deletion failing, the replay still moves each message whole, once.
// Before, the replay appended, then deleted apart: with that deletion
// failing (a crash between the two), the messages were in both logs,
// to be sent again by the next replay.
func TestReplayOneTransaction(t *testing.T) {
	st, err := persist.Open(t.TempDir(), persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	deadLog(t, st, "up/0", 3, 0)
	f := idle(t, deadDeleteFails{st}, "up/0")
	n, err := f.ReplayDead("up/0/1", "up/0/3")
	held, _ := st.DeadCount("up/0")
	if got := forwardIDs(t, st, "up/0"); n != 2 || err != nil || held != 1 || !slices.Equal(got, []string{"up/0/1", "up/0/3"}) {
		t.Fatalf("replay: %d, %v; forward log %v, %d dead letters left; want 2 replayed, in the forward log only", n, err, got, held)
	}
	wait, _ := st.ReplayDeadAsync("up/0", 1, 9, []byte("x"))
	if err := wait.Wait(); !errors.Is(err, persist.ErrNotHeld) || len(forwardIDs(t, st, "up/0")) != 2 {
		t.Fatalf("replay of a dead letter gone: %v, forward log %v; want ErrNotHeld and nothing written", err, forwardIDs(t, st, "up/0"))
	}
}
