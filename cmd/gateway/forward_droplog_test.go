package main

import (
	"context"
	"strings"
	"testing"

	"github.com/devicegate/devicegate/persist"
)

// TestDropLogDropsDeadLetters: gateway forward drop-log deletes a
// former entry's dead letters with its messages, and says how many
// (before, a log holding only dead letters was "no forward log of
// "old" holds messages", and they stayed).
func TestDropLogDropsDeadLetters(t *testing.T) {
	dir := t.TempDir()
	st, err := persist.Open(dir, persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		if err := st.AppendForward("old/0", seq, []byte("record")); err != nil {
			t.Fatal(err)
		}
	}
	for _, seq := range []uint64{1, 2} {
		if _, err := st.MoveForwardDead("old/0", seq, []byte("entry"), 10); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.MoveForwardDead("old/1", 9, []byte("entry"), 10); err != nil { // dead letters only
		t.Fatal(err)
	}
	st.Close()
	var out strings.Builder
	if err := run(context.Background(), []string{"forward", "drop-log", "old", "--data-dir", dir}, &out, &out); err != nil {
		t.Fatalf("drop-log: %v\n%s", err, out.String())
	}
	want := "dropped 1 messages and 2 dead letters of forward log old/0\ndropped 0 messages and 1 dead letters of forward log old/1\n"
	if out.String() != want {
		t.Fatalf("drop-log said %q, want %q", out.String(), want)
	}
	st, err = persist.Open(dir, persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if logs, _ := st.DeadLogs(); len(logs) != 0 {
		t.Fatalf("dead letters left in %v", logs)
	}
	if logs, _ := st.ForwardLogs(); len(logs) != 0 {
		t.Fatalf("messages left in %v", logs)
	}
}
