package persist

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"devicegate/devicelimit"
)

// TestDataFileBeforeSeveralWindows: a data file written by the gateway
// before quotas of several windows (testdata/before-issue-17, written at
// commit 6fc1c5d: meter-1 admitted 5 times under 10 per hour) loads
// unchanged, and its window is the first message window of a quota of
// several: 5 already counted there, none in the byte window.
func TestDataFileBeforeSeveralWindows(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join("testdata", "before-issue-17", FileName))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, FileName), b, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, Options{Check: CheckAlways})
	if err != nil {
		t.Fatalf("open the committed file: %v", err)
	}
	defer s.Close()
	tab, err := devicelimit.NewTable(20)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := s.RestoreWindows(tab); err != nil || n != 1 {
		t.Fatalf("restored %d windows (%v), want 1", n, err)
	}
	now := devicelimit.Tick(1_700_000_000_000_000_000).Add(time.Minute)
	v := tab.AllowAllAt("meter-1", "", []devicelimit.Limit{
		{Unit: devicelimit.Messages, N: 10, Window: time.Hour},
		{Unit: devicelimit.Bytes, N: 1000, Window: time.Hour},
	}, 40, now)
	if !v.Allowed || v.Windows[0].Count != 6 || v.Windows[1].Count != 40 {
		t.Fatalf("after the restore: %+v; want allowed, 6 messages and 40 bytes counted", v)
	}
}
