package persist

import (
	"slices"
	"strings"
	"testing"
)

// TestDeadLettersBounded: a dead-letter log of max entries never holds
// more, moving one at a time, and drops its oldest to make room, each
// counted once; what stays is the newest max, in order.
func TestDeadLettersBounded(t *testing.T) {
	s := open(t, t.TempDir())
	const log, max = "up/0", 3
	dropped := 0
	for seq := uint64(1); seq <= 8; seq++ {
		if err := s.AppendForward(log, seq, []byte{byte(seq)}); err != nil {
			t.Fatal(err)
		}
		d, err := s.MoveForwardDead(log, seq, []byte{byte(seq)}, max)
		if err != nil {
			t.Fatal(err)
		}
		dropped += d
		n, err := s.DeadCount(log)
		if err != nil {
			t.Fatal(err)
		}
		if want := min(int(seq), max); n != want {
			t.Fatalf("after %d moved: %d dead letters held, want %d", seq, n, want)
		}
	}
	if dropped != 8-max {
		t.Fatalf("%d dropped, want %d", dropped, 8-max)
	}
	var held []uint64
	if err := s.ReadDead(log, 0, func(seq uint64, _ []byte) bool { held = append(held, seq); return true }); err != nil {
		t.Fatal(err)
	}
	if len(held) != max || held[0] != 6 || held[2] != 8 {
		t.Fatalf("held %v, want [6 7 8]", held)
	}
}

// TestMoveForwardDeadMany: messages moved together leave the forward
// log and are dead letters in one transaction, the oldest making room
// beyond max once all are in; entries that do not match the numbers one
// for one are refused, naming the counts, and nothing changes.
func TestMoveForwardDeadMany(t *testing.T) {
	s := open(t, t.TempDir())
	const log = "up/0"
	for seq := uint64(1); seq <= 5; seq++ {
		if err := s.AppendForward(log, seq, []byte{byte(seq)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.MoveForwardDeadMany(log, []uint64{1, 2}, [][]byte{{1}}, 0); err == nil || !strings.Contains(err.Error(), "2 messages") || !strings.Contains(err.Error(), "1 entries") {
		t.Fatalf("2 numbers, 1 entry: %v; want an error naming both counts", err)
	}
	if n, _ := s.DeadCount(log); n != 0 {
		t.Fatalf("after the refused move %d dead letters, want 0", n)
	}
	dropped, err := s.MoveForwardDeadMany(log, []uint64{1, 2, 3, 4}, [][]byte{{1}, {2}, {3}, {4}}, 3)
	if err != nil || dropped != 1 {
		t.Fatalf("move 4 with room for 3: %d dropped, %v; want 1", dropped, err)
	}
	var dead, fwd []uint64
	if err := s.ReadDead(log, 0, func(seq uint64, _ []byte) bool { dead = append(dead, seq); return true }); err != nil {
		t.Fatal(err)
	}
	if err := s.ReadForward(log, 0, func(seq uint64, _ []byte) bool { fwd = append(fwd, seq); return true }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(dead, []uint64{2, 3, 4}) || !slices.Equal(fwd, []uint64{5}) {
		t.Fatalf("dead letters %v, forward log %v; want [2 3 4] and [5]", dead, fwd)
	}
}
