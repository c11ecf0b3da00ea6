package persist

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
)

// readAll returns the sequence numbers and records of a forward log from
// seq on.
func readAll(t *testing.T, s *Store, log string, from uint64) ([]uint64, []string) {
	t.Helper()
	var seqs []uint64
	var recs []string
	if err := s.ReadForward(log, from, func(seq uint64, rec []byte) bool {
		seqs = append(seqs, seq)
		recs = append(recs, string(rec))
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return seqs, recs
}

// TestForwardLogOrderAndDelete: appends made concurrently, alongside
// deferrals in the same group commits, read back in sequence order; a
// deletion removes exactly what the upstream acknowledged; a read can
// start at a sequence number and stop early; the logs are apart.
func TestForwardLogOrderAndDelete(t *testing.T) {
	s := open(t, t.TempDir())
	const n = 200
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if err := s.AppendForward("cloud/0", uint64(i+1), fmt.Appendf(nil, "m%d", i+1)); err != nil {
				t.Error(err)
			}
			if err := s.Enqueue("dev", uint64(i+1), []byte("deferred")); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := s.AppendForward("cloud/1", 7, []byte("other")); err != nil {
		t.Fatal(err)
	}
	seqs, recs := readAll(t, s, "cloud/0", 0)
	if len(seqs) != n || !slices.IsSorted(seqs) || recs[0] != "m1" || recs[n-1] != fmt.Sprintf("m%d", n) {
		t.Fatalf("read %d messages (sorted %v), first %q last %q", len(seqs), slices.IsSorted(seqs), recs[0], recs[len(recs)-1])
	}
	if msgs, _, err := s.DeferredStats(); err != nil || msgs != n {
		t.Fatalf("deferred messages %d (%v), want %d beside the forward log", msgs, err, n)
	}
	acked := []uint64{1, 2, 3, 10, 999}
	if err := s.DeleteForward("cloud/0", acked); err != nil {
		t.Fatal(err)
	}
	seqs, _ = readAll(t, s, "cloud/0", 0)
	if len(seqs) != n-4 || seqs[0] != 4 || slices.Contains(seqs, 10) {
		t.Fatalf("after deleting %v: %d left, first %d", acked, len(seqs), seqs[0])
	}
	msgs, bytes, first, last, err := s.ForwardStats("cloud/0")
	if err != nil || msgs != n-4 || first != 4 || last != n || bytes <= 0 {
		t.Fatalf("stats %d messages %d bytes first %d last %d (%v)", msgs, bytes, first, last, err)
	}
	var got []uint64
	if err := s.ReadForward("cloud/0", 100, func(seq uint64, _ []byte) bool {
		got = append(got, seq)
		return len(got) < 3
	}); err != nil || !slices.Equal(got, []uint64{100, 101, 102}) {
		t.Fatalf("read from 100, three: %v (%v)", got, err)
	}
	if seqs, recs := readAll(t, s, "cloud/1", 0); !slices.Equal(seqs, []uint64{7}) || recs[0] != "other" {
		t.Fatalf("the other log: %v %v", seqs, recs)
	}
	if seqs, _ := readAll(t, s, "never-written", 0); len(seqs) != 0 {
		t.Fatalf("a log never written holds %v", seqs)
	}
	if err := s.AppendForward("", 1, nil); err == nil {
		t.Fatal("a forward log without a name was written")
	}
}

// TestForwardLogSurvivesReopen: what AppendForward acknowledged is in
// the file after the store is closed and opened again, and passes the
// start-up check.
func TestForwardLogSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	for i := range 50 {
		if err := s.AppendForward("cloud/0", uint64(i+1), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteForward("cloud/0", []uint64{1, 2}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, Options{Check: CheckAlways})
	if err != nil {
		t.Fatalf("reopen with the consistency check: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if seqs, _ := readAll(t, s, "cloud/0", 0); len(seqs) != 48 || seqs[0] != 3 || seqs[47] != 50 {
		t.Fatalf("after reopening: %d messages, %v...", len(seqs), seqs[:min(3, len(seqs))])
	}
}

// TestForwardLogNeverReusesNumbers: a log emptied by its deletions still
// reports the highest number it was given, after a reopen too, so a
// forwarder numbering on from it never gives a new message the ID of
// one a destination has already seen (a de-duplicating destination
// would drop it); the origin the IDs start with is drawn once and kept.
func TestForwardLogNeverReusesNumbers(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	origin, err := s.Origin()
	if err != nil || len(origin) != 16 {
		t.Fatalf("origin %q (%v), want 16 hex digits", origin, err)
	}
	for i := range 5 {
		if err := s.AppendForward("cloud/0", uint64(i+1), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteForward("cloud/0", []uint64{1, 2, 3, 4, 5}); err != nil {
		t.Fatal(err)
	}
	if msgs, _, first, last, err := s.ForwardStats("cloud/0"); err != nil || msgs != 0 || first != 0 || last != 5 {
		t.Fatalf("emptied log: %d messages, first %d, last %d (%v); want 0, 0, 5", msgs, first, last, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	if _, _, _, last, err := s.ForwardStats("cloud/0"); err != nil || last != 5 {
		t.Fatalf("after reopening, last %d (%v), want 5", last, err)
	}
	if again, err := s.Origin(); err != nil || again != origin {
		t.Fatalf("origin after reopening %q (%v), was %q", again, err, origin)
	}
	if other, _ := open(t, t.TempDir()).Origin(); other == origin {
		t.Fatalf("two data files share the origin %q", origin)
	}
}

// TestCommitsCountDeletionsAlone: Commits counts every group commit
// transaction, and as deletions-only those that carried no put: a
// deletion queued with an append shares its transaction.
func TestCommitsCountDeletionsAlone(t *testing.T) {
	s := open(t, t.TempDir())
	if err := s.AppendForward("cloud/0", 1, []byte("m1")); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteForward("cloud/0", []uint64{1}); err != nil {
		t.Fatal(err)
	}
	if got := s.Commits(); got != (Commits{Transactions: 2, DeletionsOnly: 1}) {
		t.Fatalf("after an append and a deletion apart: %+v, want 2 transactions, 1 of deletions alone", got)
	}
	// An append and a deletion taken from the queue together (as the
	// committer takes what was queued during its last transaction): one
	// transaction, not of deletions alone.
	put := &request{log: []byte("cloud/0"), key: forwardKey(2), rec: []byte("m2"), done: make(chan error, 1)}
	del := &request{log: []byte("cloud/0"), dels: [][]byte{forwardKey(1)}, done: make(chan error, 1)}
	s.commit.pending.Add(2)
	s.commit.commit([]*request{put, del})
	if err := errors.Join(<-put.done, <-del.done); err != nil {
		t.Fatal(err)
	}
	if got := s.Commits(); got != (Commits{Transactions: 3, DeletionsOnly: 1}) {
		t.Fatalf("after an append and a deletion together: %+v, want 3 transactions, still 1 of deletions alone", got)
	}
}
