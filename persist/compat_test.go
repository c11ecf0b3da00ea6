package persist

import (
	"context"
	"encoding/hex"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
)

// beforeSeveralWindows is the record the gateway stored for meter-1
// (admitted 5 times under 10 per hour at beforeAt, 20 buckets) before quotas
// of several windows: read from a data file written at commit 6fc1c5d.
var beforeAt = devicelimit.Tick(1_700_000_000_000_000_000) // the instant of its admissions

const beforeSeveralWindows = "0180c0e285e368dcb8c00415000000000000000000000000000000000000000005"

// TestDataFileBeforeSeveralWindows: a device's one window is stored
// under the same key in the same bytes as before quotas of several
// windows (so data files of earlier gateways load unchanged), and once
// restored it is the first message window of a quota of several: 5
// already counted there, nothing in the byte window.
func TestDataFileBeforeSeveralWindows(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	tab, err := devicelimit.NewTable(20)
	if err != nil {
		t.Fatal(err)
	}
	clock := devicelimit.NewManualClock(beforeAt)
	for range 5 {
		tab.AllowAt("meter-1", devicelimit.Quota{Limit: 10, Window: time.Hour}, clock.Now())
	}
	sn := NewSnapshotter(s, tab, clock, time.Second, nil)
	if _, err := sn.Snapshot(); err != nil {
		t.Fatal(err)
	}
	if err := sn.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var stored string
	if err := s.view(func(tx *bolt.Tx) error {
		stored = hex.EncodeToString(tx.Bucket(bucketWindows).Get([]byte("meter-1")))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if stored != beforeSeveralWindows {
		t.Fatalf("meter-1 stored as %s, before quotas of several windows %s", stored, beforeSeveralWindows)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, Options{Check: CheckAlways})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	again, _ := devicelimit.NewTable(20)
	if n, err := s.RestoreWindows(again); err != nil || n != 1 {
		t.Fatalf("restored %d windows (%v), want 1", n, err)
	}
	v := again.AllowAllAt("meter-1", "", []devicelimit.Limit{
		{Unit: devicelimit.Messages, N: 10, Window: time.Hour},
		{Unit: devicelimit.Bytes, N: 1000, Window: time.Hour},
	}, 40, beforeAt.Add(time.Minute))
	if !v.Allowed || v.Windows[0].Count != 6 || v.Windows[1].Count != 40 {
		t.Fatalf("after the restore: %+v; want allowed, 6 messages and 40 bytes counted", v)
	}
}

// overrideBeforeSeveralWindows is the override record (3 per hour,
// defer, expiring at 1.8e18 ns) a gateway at commit 6fc1c5d wrote.
const overrideBeforeSeveralWindows = "010380c0e285e368018080a0bbd29df1fa31"

// TestOverrideBeforeSeveralWindows: an override of one window is
// written in the same bytes as before quotas of several windows, and
// those bytes read back as the same override.
func TestOverrideBeforeSeveralWindows(t *testing.T) {
	o := devicelimit.Override{Quota: devicelimit.Quota{Limit: 3, Window: time.Hour, Policy: devicelimit.PolicyDefer}, ExpiresAt: 1_800_000_000_000_000_000}
	if got := hex.EncodeToString(appendOverride(nil, o)); got != overrideBeforeSeveralWindows {
		t.Fatalf("override written as %s, before several windows %s", got, overrideBeforeSeveralWindows)
	}
	b, _ := hex.DecodeString(overrideBeforeSeveralWindows)
	if got, err := decodeOverride(b); err != nil || !reflect.DeepEqual(got, o) {
		t.Fatalf("the earlier record reads as %+v, %v; want %+v", got, err, o)
	}
}
