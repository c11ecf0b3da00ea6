package flagvalue

import (
	"testing"
	"time"
)

func TestInt(t *testing.T) {
	var i Int
	if err := i.Set("42"); err != nil || i.V != 42 || i.String() != "42" {
		t.Fatalf("Set(42): %v, V=%d, String=%q", err, i.V, i.String())
	}
	for _, bad := range []string{"", "4.2", "ten", "1e3"} {
		err := i.Set(bad)
		if err == nil || err.Error() != "must be an integer" {
			t.Errorf("Set(%q) = %v, want \"must be an integer\"", bad, err)
		}
		if i.V != 42 {
			t.Errorf("Set(%q) changed V to %d", bad, i.V)
		}
	}
}

func TestDuration(t *testing.T) {
	var d Duration
	if err := d.Set("1m30s"); err != nil || d.V != 90*time.Second || d.String() != "1m30s" {
		t.Fatalf("Set(1m30s): %v, V=%v, String=%q", err, d.V, d.String())
	}
	for _, bad := range []string{"", "10", "ten seconds"} {
		err := d.Set(bad)
		if err == nil || err.Error() != `must be a duration like "10s"` {
			t.Errorf("Set(%q) = %v, want the duration message", bad, err)
		}
		if d.V != 90*time.Second {
			t.Errorf("Set(%q) changed V to %v", bad, d.V)
		}
	}
}
