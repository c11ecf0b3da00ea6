package persist

import "testing"

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
