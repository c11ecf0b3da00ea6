package config

import (
	"testing"
	"time"
)

// TestOneWindow: a limit over windows keeps the limit and takes the
// built-in window; a window over windows takes the built-in limit; a
// quota of one window is left alone.
func TestOneWindow(t *testing.T) {
	d := Default().Limits.Default
	ws := []QuotaWindow{{Messages: 1, Window: Duration(time.Second)}}
	q := Quota{Limit: 7, Windows: ws}
	q.OneWindow()
	if q.Windows != nil || q.Limit != 7 || q.Window != d.Window {
		t.Fatalf("limit over windows: %+v", q)
	}
	q = Quota{Window: Duration(time.Minute), Windows: ws}
	q.OneWindow()
	if q.Windows != nil || q.Limit != d.Limit || q.Window != Duration(time.Minute) {
		t.Fatalf("window over windows: %+v", q)
	}
	q = Quota{Limit: 3}
	q.OneWindow()
	if q.Limit != 3 || q.Window != 0 {
		t.Fatalf("one window changed: %+v", q)
	}
}
