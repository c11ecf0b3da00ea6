package persist

import (
	"fmt"
	"slices"
	"testing"
)

// TestKeptSessions: kept sessions and their queued commands survive a
// reopen; deleting a session takes its commands and no other's (dev-1
// is a prefix of dev-10's ID, not of its keys).
func TestKeptSessions(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"dev-1", "dev-10"} {
		if err := s.PutSession(id, []byte("rec-"+id)); err != nil {
			t.Fatal(err)
		}
		for _, p := range []uint16{1, 2, 65535} {
			if err := s.PutCommand(id, p, fmt.Appendf(nil, "%s/%d", id, p)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.DeleteCommand("dev-10", 2); err != nil {
		t.Fatal(err)
	}
	if err := s.PutSession("", nil); err == nil {
		t.Fatal("PutSession with an empty client ID: no error")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	load := func(s *Store) (sessions, commands []string) {
		t.Helper()
		if err := s.LoadSessions(func(id string, rec []byte) error {
			sessions = append(sessions, id+"="+string(rec))
			return nil
		}, func(id string, p uint16, rec []byte) error {
			commands = append(commands, fmt.Sprintf("%s#%d=%s", id, p, rec))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return sessions, commands
	}
	s, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sessions, commands := load(s)
	if want := []string{"dev-1=rec-dev-1", "dev-10=rec-dev-10"}; !slices.Equal(sessions, want) {
		t.Fatalf("sessions %v, want %v", sessions, want)
	}
	if want := []string{"dev-1#1=dev-1/1", "dev-1#2=dev-1/2", "dev-1#65535=dev-1/65535", "dev-10#1=dev-10/1", "dev-10#65535=dev-10/65535"}; !slices.Equal(commands, want) {
		t.Fatalf("commands %v, want %v", commands, want)
	}
	if err := s.DeleteSession("dev-1"); err != nil {
		t.Fatal(err)
	}
	sessions, commands = load(s)
	if want := []string{"dev-10=rec-dev-10"}; !slices.Equal(sessions, want) {
		t.Fatalf("after DeleteSession(dev-1): sessions %v, want %v", sessions, want)
	}
	if want := []string{"dev-10#1=dev-10/1", "dev-10#65535=dev-10/65535"}; !slices.Equal(commands, want) {
		t.Fatalf("after DeleteSession(dev-1): commands %v, want %v", commands, want)
	}
}
