//go:build linux

package persist

import (
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// A reset whose write fails says so and leaves the windows empty in
// memory, and the file as it was; a second reset once the disk works
// writes what the first left ("reset" false: the windows were empty
// already), as docs/admin-api.md tells the operator to do.
func TestResetWriteFailure(t *testing.T) {
	s := open(t, t.TempDir())
	tab := newTable(t, 10)
	clock := devicelimit.NewManualClock(t0)
	sn := NewSnapshotter(s, tab, clock, time.Hour, nil)
	tab.AllowAt("dev", q, t0)
	if _, err := sn.Snapshot(); err != nil {
		t.Fatal(err)
	}
	restore := limitFileSize(t, 2*4096) // no transaction can write its pages
	had, err := sn.Reset("dev")
	if err == nil || !had {
		t.Fatalf("Reset on a failing disk = %v, %v; want true and an error", had, err)
	}
	t.Logf("the failed reset: %v", err)
	if tab.PeekAt("dev", q, t0).Count != 0 {
		t.Error("the failed reset left the window's counts in memory")
	}
	if _, ok := stored(t, s)["dev"]; !ok {
		t.Fatal("the failed reset deleted the window from the file")
	}
	restore()
	if had, err := sn.Reset("dev"); had || err != nil {
		t.Fatalf("second Reset = %v, %v; want false, nil", had, err)
	}
	if _, ok := stored(t, s)["dev"]; ok {
		t.Error("the second reset left the window in the file")
	}
}
