package forward

import (
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/poll"
	"github.com/devicegate/devicegate/persist"
)

// floorForwarder runs a forwarder of an upstream that is down, on a
// store whose filesystem reports free bytes free, with a floor of
// floor bytes.
func floorForwarder(t *testing.T, policy Overflow, floor int64, free *atomic.Int64) (*Forwarder, *persist.Store) {
	t.Helper()
	st, err := persist.Open(t.TempDir(), persist.Options{MinFreeBytes: floor,
		DiskFree: func(string) (int64, bool) { return free.Load(), true }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f := startForwarder(t, Config{Name: "up/0", Dial: &MQTT{Address: deadAddr(t), ClientID: "gw"}, MaxQoS: 1, Overflow: policy,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}, st, nil)
	return f, st
}

// appendBatch appends n messages, numbered i, with payload(i), in group
// commits: all queued, then all waited for.
func appendBatch(t *testing.T, f *Forwarder, n int, payload func(i int) string) {
	t.Helper()
	waits := make([]Queued, 0, n)
	for i := range n {
		wait, err := f.AppendAsync(msg("devices/d/t", payload(i)))
		if err != nil {
			t.Fatal(err)
		}
		waits = append(waits, wait)
	}
	for _, w := range waits {
		if err := w.Wait(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFloorRefuseNew: once the data file's disk is below its floor, a
// log under refuse_new refuses new messages with ErrFull (and
// ErrLowSpace), counted in Refused and LowSpace; nothing refused is in
// the log, nothing appended before is lost; with room again, appends
// go on.
func TestFloorRefuseNew(t *testing.T) {
	var free atomic.Int64
	free.Store(1 << 30)
	f, st := floorForwarder(t, RefuseNew, 64<<20, &free)
	for i := range 10 {
		if err := f.Append(msg("devices/d/t", strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	free.Store(32 << 20)
	for i := 10; i < 20; i++ {
		if err := f.Append(msg("devices/d/t", strconv.Itoa(i))); !errors.Is(err, ErrFull) || !errors.Is(err, ErrLowSpace) {
			t.Fatalf("message %d below the floor: %v, want ErrFull and ErrLowSpace", i, err)
		}
	}
	if s := f.Stats(); s.Backlog != 10 || s.Refused != 10 || s.LowSpace != 10 || logLen(t, st) != 10 {
		t.Fatalf("stats %+v, log %d; want 10 kept, 10 refused for the floor", s, logLen(t, st))
	}
	free.Store(1 << 30)
	if err := f.Append(msg("devices/d/t", "20")); err != nil {
		t.Fatalf("with room again: %v", err)
	}
	if n := logLen(t, st); n != 11 {
		t.Fatalf("log holds %d, want 11", n)
	}
}

// TestFloorDropOldest: once the disk is below its floor, a log under
// drop_oldest stops growing: its oldest messages are dropped (counted in
// DroppedOldest and LowSpace) to make room in the data file's pages for
// the new ones. An append that comes before the room is made fails (not
// acknowledged: the device sends it again); sent again, every new
// message is stored, in order, and the log holds no more than before.
func TestFloorDropOldest(t *testing.T) {
	var free atomic.Int64
	free.Store(1 << 30)
	const floor = 64 << 20
	f, st := floorForwarder(t, DropOldest, floor, &free)
	payload := string(make([]byte, 1000))
	appendBatch(t, f, 2000, func(i int) string { return payload + strconv.Itoa(i) })
	before := f.Stats().BacklogBytes
	// The disk 1 MiB below its floor, counting the file's free pages:
	// room is made by dropping the oldest.
	room, ok := st.Room()
	if !ok {
		t.Fatal("no room known")
	}
	free.Add(floor - room - 1<<20)
	failed := 0
	deadline := time.Now().Add(30 * time.Second)
	for i := 2000; i < 3000; i++ {
		for {
			err := f.Append(msg("devices/d/t", payload+strconv.Itoa(i)))
			if err == nil {
				break
			}
			if !errors.Is(err, persist.ErrLowSpace) || time.Now().After(deadline) {
				t.Fatalf("message %d: %v (%d failed appends so far)", i, err, failed)
			}
			failed++
		}
	}
	s := f.Stats()
	if s.DroppedOldest == 0 || s.LowSpace != s.DroppedOldest || s.Refused != 0 || s.BacklogBytes > before {
		t.Fatalf("stats %+v (%d bytes before); want the oldest dropped for the floor, the log no larger", s, before)
	}
	var got []int
	if err := st.ReadForward("up/0", 0, func(_ uint64, rec []byte) bool {
		m, _ := decodeRecord(rec)
		n, _ := strconv.Atoi(string(m.Payload[len(payload):]))
		got = append(got, n)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) < 1000 || got[len(got)-1] != 2999 {
		t.Fatalf("the log holds %d messages up to %d, want at least the 1,000 new ones", len(got), got[len(got)-1])
	}
	for i, n := range got[len(got)-1000:] {
		if n != 2000+i {
			t.Fatalf("new message %d is %d: lost or out of order", i, n)
		}
	}
	t.Logf("%d appends failed at the floor, sent again; %d oldest dropped", failed, s.DroppedOldest)
	free.Store(1 << 30)
	if err := f.Append(msg("devices/d/t", "x")); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the bound lifted with room again", func() bool { return f.overBound() == false && f.floorBound.Load() == 0 })
}
