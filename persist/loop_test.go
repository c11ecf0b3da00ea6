package persist

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestSnapshotLoop runs the background loop in a synctest bubble, where
// time passes only when every goroutine waits.
func TestSnapshotLoop(t *testing.T) {
	s := open(t, t.TempDir())
	synctest.Test(t, func(t *testing.T) {
		var logs logBuffer
		tab := newTable(t, 10)
		clock := devicelimit.NewManualClock(t0)
		sn := NewSnapshotter(s, tab, clock, 2*time.Second, newLogger(&logs))
		sn.Start()
		sn.Start() // a second Start does nothing
		tab.AllowAt("a", q, t0)

		time.Sleep(time.Second)
		synctest.Wait()
		if len(stored(t, s)) != 0 {
			t.Fatal("written before the first interval")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if len(stored(t, s)) != 1 {
			t.Fatal("not written after the first interval")
		}
		if logs.count("level=DEBUG", `msg="snapshot written"`, "windows=1", "deleted=0", "bytes=", "took=") != 1 {
			t.Fatalf("want one debug line for the snapshot:\n%s", logs.String())
		}
		// Intervals with no change write and log nothing.
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if n := logs.count("snapshot written"); n != 1 {
			t.Fatalf("%d snapshot lines after idle intervals, want 1:\n%s", n, logs.String())
		}

		tab.AllowAt("b", q, t0)
		clock.Advance(time.Minute)
		if err := sn.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
		if len(stored(t, s)) != 2 {
			t.Fatal("final snapshot missing")
		}
		if logs.count("level=INFO") != 0 || logs.count("level=ERROR") != 0 {
			t.Fatalf("unexpected log lines:\n%s", logs.String())
		}
	})
	dir := copyStore(t, s)
	if m := open(t, dir).Meta(); !m.CleanShutdown || m.HighWater != t0.Add(time.Minute) {
		t.Fatalf("meta after close %+v", m)
	}
}
