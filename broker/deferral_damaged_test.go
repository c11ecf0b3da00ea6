package broker

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/persist"
)

// damagedIn lists the deferred messages s holds set aside as damaged.
func damagedIn(t *testing.T, s persistDefer) []DeferredKey {
	t.Helper()
	var out []DeferredKey
	if err := s.DamagedDeferred(func(device string, seq uint64, _ []byte) {
		out = append(out, DeferredKey{Device: device, Seq: seq})
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDeferDamagedRecordInFileSetAside: messages deferred, the gateway
// stopped, one payload byte of one record changed in the bbolt file on
// disk. At the next start that record fails its checksum: it is set
// aside in the file (counted, listed by the store), never released, and
// the device's other messages are released in order. Before, the
// damaged payload was released as if sound.
func TestDeferDamagedRecordInFileSetAside(t *testing.T) {
	dir := t.TempDir()
	clock := devicelimit.NewManualClock(t0)
	rules := []devicelimit.Rule{deferRule("dev-*", 1, time.Second)}
	f1, s1 := deferSome(t, dir, clock, rules, 6)
	stored := storedMsgs(t, s1)
	if len(stored) != 5 || string(stored[2].msg.Payload) != "m-3" {
		t.Fatalf("stored %+v, want m-1..m-5 deferred", stored)
	}
	damagedSeq := stored[2].seq
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, persist.FileName)
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// bbolt writes pages anew: free pages may hold former copies too.
	if n := bytes.Count(file, []byte("m-3")); n == 0 {
		t.Fatal("the payload m-3 is not in the file")
	}
	file = bytes.ReplaceAll(file, []byte("m-3"), []byte("m-9"))
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}

	s2 := openStore(t, dir)
	f2 := start(t, fixtureOpts{rules: rules, store: s2, clock: clock, table: f1.table})
	if st := f2.srv.Stats(); st.QueueMessages != 4 || st.DeferredDamaged != 1 {
		t.Fatalf("restored: %d queued, %d damaged; want 4 and 1", st.QueueMessages, st.DeferredDamaged)
	}
	if got := damagedIn(t, s2); len(got) != 1 || got[0] != (DeferredKey{Device: "dev-1", Seq: damagedSeq}) {
		t.Fatalf("set aside %+v, want dev-1's message %d", got, damagedSeq)
	}
	sub := f2.subscribeMsgs(t, "sub", "t/#")
	f2.releaseAll(t, sub, 0, 1200*time.Millisecond, 10)
	sub.waitLen(t, 4)
	if got, want := sub.payloads(), []string{"m-1", "m-2", "m-4", "m-5"}; !equal(got, want) {
		t.Fatalf("released %q, want %q (the damaged m-3 never)", got, want)
	}
	closeNow(t, f2.srv)
	if n := len(storedMsgs(t, s2)); n != 0 {
		t.Fatalf("%d messages left in the queue", n)
	}
	if got := damagedIn(t, s2); len(got) != 1 {
		t.Fatalf("set aside after the release: %+v, want the damaged one kept", got)
	}
}

// TestDeferUndecodableRecordSetAside: a stored record that does not
// decode (no checksum to fail) is set aside the same way: the server
// starts, counts it, and never releases it.
func TestDeferUndecodableRecordSetAside(t *testing.T) {
	store := openStore(t, t.TempDir())
	if err := store.Enqueue("dev-1", 7, []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{deferRule("dev-*", 1, time.Second)}, store: store})
	if st := f.srv.Stats(); st.QueueMessages != 0 || st.DeferredDamaged != 1 {
		t.Fatalf("restored: %+v; want none queued, 1 damaged", st)
	}
	if got := damagedIn(t, store); len(got) != 1 || got[0] != (DeferredKey{Device: "dev-1", Seq: 7}) {
		t.Fatalf("set aside %+v, want message 7 of dev-1", got)
	}
}

// TestDeferRecordsBeforeChecksums: records of versions 1 and 2, as
// gateways wrote them before records had checksums (the first one's
// bytes from a data file of commit 6fc1c5d), still load and are
// released; none is set aside.
func TestDeferRecordsBeforeChecksums(t *testing.T) {
	store := openStore(t, t.TempDir())
	at := devicelimit.Tick(1_700_000_000_000_000_000)       // the first one's enqueue instant
	v1, _ := hex.DecodeString(deferredBeforeSeveralWindows) // payload "hello" on devices/meter-2/t
	v2 := appendDeferred(nil, &deferredMsg{Enqueued: at, Quota: devicelimit.WithWindows(devicelimit.PolicyDefer,
		devicelimit.Limit{Unit: devicelimit.Messages, N: 10, Window: time.Minute}), Version: 5, QoS: 1, Topic: "devices/meter-2/t", Payload: []byte("again")})
	if v1[0] != deferredVersion || v2[0] != deferredWindows {
		t.Fatalf("versions %d and %d, want 1 and 2", v1[0], v2[0])
	}
	for i, rec := range [][]byte{v1, v2} {
		if err := store.Enqueue("meter-2", uint64(i+1), rec); err != nil {
			t.Fatal(err)
		}
	}
	f := start(t, fixtureOpts{store: store, clock: devicelimit.NewManualClock(at.Add(time.Minute))})
	if st := f.srv.Stats(); st.QueueMessages != 2 || st.DeferredDamaged != 0 {
		t.Fatalf("restored: %+v; want 2 queued, none damaged", st)
	}
	sub := f.subscribeMsgs(t, "sub", "devices/#")
	f.releaseAll(t, sub, 0, time.Minute, 3)
	sub.waitLen(t, 2)
	if got, want := sub.payloads(), []string{"hello", "again"}; !equal(got, want) {
		t.Fatalf("released %q, want %q", got, want)
	}
}
