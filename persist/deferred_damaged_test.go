package persist

import (
	"testing"
)

// TestSetAsideDeferred: messages set aside leave the queue and are kept
// as damaged, surviving a reopen; a key not stored is no error; with no
// keys, the count is read and nothing written.
func TestSetAsideDeferred(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	for seq := uint64(1); seq <= 3; seq++ {
		if err := s.Enqueue("dev-1", seq, []byte{byte(seq)}); err != nil {
			t.Fatal(err)
		}
	}
	held, err := s.SetAsideDeferred([]DeferredKey{{"dev-1", 1}, {"dev-1", 3}, {"dev-2", 9}})
	if err != nil || held != 2 {
		t.Fatalf("set aside: %d held, %v; want 2", held, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	defer s.Close()
	var queued, aside []uint64
	if err := s.LoadDeferred(func(_ string, seq uint64, _ []byte) error { queued = append(queued, seq); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.DamagedDeferred(func(device string, seq uint64, rec []byte) {
		if device != "dev-1" || len(rec) != 1 || rec[0] != byte(seq) {
			t.Errorf("damaged %s/%d holds %v", device, seq, rec)
		}
		aside = append(aside, seq)
	}); err != nil {
		t.Fatal(err)
	}
	if len(queued) != 1 || queued[0] != 2 || len(aside) != 2 || aside[0] != 1 || aside[1] != 3 {
		t.Fatalf("after a reopen: queued %v, set aside %v; want [2] and [1 3]", queued, aside)
	}
	st := s.db.Stats()
	before := st.TxStats.GetWrite()
	if held, err := s.SetAsideDeferred(nil); err != nil || held != 2 {
		t.Fatalf("count: %d, %v; want 2", held, err)
	}
	st = s.db.Stats()
	if after := st.TxStats.GetWrite(); after != before {
		t.Fatalf("counting wrote %d pages", after-before)
	}
}
