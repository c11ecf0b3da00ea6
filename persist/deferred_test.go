package persist

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
)

// message is one deferred message as LoadDeferred reports it.
type message struct {
	device string
	seq    uint64
	rec    string
}

// loadAll returns every stored deferred message in LoadDeferred's order.
func loadAll(t testing.TB, s *Store) []message {
	t.Helper()
	var got []message
	err := s.LoadDeferred(func(device string, seq uint64, rec []byte) error {
		got = append(got, message{device, seq, string(rec)})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// checkOrder fails unless msgs are grouped by device and in increasing
// seq within a device.
func checkOrder(t testing.TB, msgs []message) {
	t.Helper()
	seen := map[string]bool{}
	for i, m := range msgs {
		if i > 0 && msgs[i-1].device == m.device {
			if msgs[i-1].seq >= m.seq {
				t.Fatalf("device %.20q: seq %d after %d", m.device, m.seq, msgs[i-1].seq)
			}
			continue
		}
		if seen[m.device] {
			t.Fatalf("device %.20q: messages not contiguous (again at %d)", m.device, i)
		}
		seen[m.device] = true
	}
}

// want sorts msgs as LoadDeferred must return them: by key.
func sortedByKey(msgs []message) []message {
	msgs = slices.Clone(msgs)
	slices.SortFunc(msgs, func(a, b message) int {
		return bytes.Compare(appendDeferredKey(nil, a.device, a.seq), appendDeferredKey(nil, b.device, b.seq))
	})
	return msgs
}

func rec(device string, seq uint64) string {
	return fmt.Sprintf("%.16s/%d/%s", device, seq, strings.Repeat("r", int(seq%97)))
}

// enqueueAll enqueues msgs from one goroutine per device, concurrently.
func enqueueAll(t testing.TB, s *Store, msgs []message) {
	t.Helper()
	byDevice := map[string][]message{}
	for _, m := range msgs {
		byDevice[m.device] = append(byDevice[m.device], m)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(msgs))
	for _, ms := range byDevice {
		wg.Go(func() {
			for _, m := range ms {
				if err := s.Enqueue(m.device, m.seq, []byte(m.rec)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestDeferredRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	// IDs that are prefixes of each other, hold zero bytes and 0xff,
	// and have lengths on both sides of a uvarint byte boundary.
	devices := []string{"a", "ab", "a\x00", "\x00", "b", "\xff\xff", "abc",
		strings.Repeat("x", 127), strings.Repeat("x", 128), strings.Repeat("x", 300),
		strings.Repeat("y", MaxDeferredDevice)}
	for i := range 40 {
		devices = append(devices, fmt.Sprintf("sensor-%03d", i))
	}
	var msgs []message
	for i, d := range devices {
		seqs := []uint64{0, 1, 255, 256, 1 << 32, math.MaxUint64}
		for k := range 30 + i%7 {
			seqs = append(seqs, uint64(1000+k*3))
		}
		for _, seq := range seqs {
			msgs = append(msgs, message{d, seq, rec(d, seq)})
		}
	}
	msgs = append(msgs, message{"empty-record", 7, ""})
	enqueueAll(t, s, msgs)
	if n, size, err := s.DeferredStats(); err != nil || n != len(msgs) {
		t.Fatalf("stats %d messages (%v), want %d", n, err, len(msgs))
	} else if want := sumRecs(msgs); size != want {
		t.Fatalf("stats %d bytes, want %d", size, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, dir)
	got := loadAll(t, s)
	checkOrder(t, got)
	if want := sortedByKey(msgs); !slices.Equal(got, want) {
		t.Fatalf("loaded %d messages, want %d; first difference at %d", len(got), len(want), firstDiff(got, want))
	}
}

func sumRecs(msgs []message) int64 {
	var n int64
	for _, m := range msgs {
		n += int64(len(m.rec))
	}
	return n
}

func firstDiff(a, b []message) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestEnqueueReplacesSameKey(t *testing.T) {
	s := open(t, t.TempDir())
	for _, r := range []string{"first", "second"} {
		if err := s.Enqueue("d", 1, []byte(r)); err != nil {
			t.Fatal(err)
		}
	}
	if got := loadAll(t, s); !slices.Equal(got, []message{{"d", 1, "second"}}) {
		t.Fatalf("got %v, want the second record only", got)
	}
}

func TestDeleteDeferred(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	s.delChunk = 7
	var msgs []message
	for _, d := range []string{"a", "ab", "b"} {
		for seq := range uint64(20) {
			msgs = append(msgs, message{d, seq, rec(d, seq)})
		}
	}
	enqueueAll(t, s, msgs)

	var del []DeferredKey
	var keep []message
	for i, m := range msgs {
		if i%3 == 0 || m.device == "ab" {
			del = append(del, DeferredKey{m.device, m.seq})
		} else {
			keep = append(keep, m)
		}
	}
	// Missing keys, and keys that can name nothing, are not errors.
	del = append(del, DeferredKey{"a", 99}, DeferredKey{"zz", 0}, DeferredKey{"", 1},
		DeferredKey{strings.Repeat("x", MaxDeferredDevice+1), 0})
	before := txID(t, s)
	if err := s.DeleteDeferred(del); err != nil {
		t.Fatal(err)
	}
	// Transactions of at most 7 keys; a chunk of only invalid keys
	// takes none.
	want := 0
	for c := range slices.Chunk(del, 7) {
		if slices.ContainsFunc(c, func(k DeferredKey) bool { return validDeferredDevice(k.Device) == nil }) {
			want++
		}
	}
	if txs := txID(t, s) - before; txs != want || want < 5 {
		t.Fatalf("%d transactions, want %d", txs, want)
	}
	if got, want := loadAll(t, s), sortedByKey(keep); !slices.Equal(got, want) {
		t.Fatalf("after delete: %v, want %v", got, want)
	}
	if err := s.DeleteDeferred(del); err != nil {
		t.Fatalf("deleting again: %v", err)
	}
	if err := s.DeleteDeferred(nil); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s = open(t, dir)
	if got, want := loadAll(t, s), sortedByKey(keep); !slices.Equal(got, want) {
		t.Fatalf("after reopen: %v, want %v", got, want)
	}
}

// TestEnqueueDurableWhenAcked copies the data file right after Enqueue
// returns, the store still open, as a crash would leave it: the record
// is in the copy.
func TestEnqueueDurableWhenAcked(t *testing.T) {
	s := open(t, t.TempDir())
	var want []message
	for i := range uint64(3) {
		m := message{"dev", i, rec("dev", i)}
		if err := s.Enqueue(m.device, m.seq, []byte(m.rec)); err != nil {
			t.Fatal(err)
		}
		want = append(want, m)
		c := open(t, copyStore(t, s))
		if got := loadAll(t, c); !slices.Equal(got, want) {
			t.Fatalf("copy after enqueue %d holds %v, want %v", i, got, want)
		}
		c.Close()
	}
	if err := s.DeleteDeferred([]DeferredKey{{"dev", 1}}); err != nil {
		t.Fatal(err)
	}
	if got := loadAll(t, open(t, copyStore(t, s))); !slices.Equal(got, []message{want[0], want[2]}) {
		t.Fatalf("copy after delete holds %v", got)
	}
}

func TestEnqueueInvalidDevice(t *testing.T) {
	s := open(t, t.TempDir())
	before := txID(t, s)
	for _, d := range []string{"", strings.Repeat("x", MaxDeferredDevice+1), strings.Repeat("x", devicelimit.MaxDeviceID+1)} {
		err := s.Enqueue(d, 1, []byte("r"))
		if !errors.Is(err, devicelimit.ErrInvalidDevice) {
			t.Fatalf("device of %d bytes: got %v, want ErrInvalidDevice", len(d), err)
		}
		if len(d) == MaxDeferredDevice+1 && !strings.Contains(err.Error(), fmt.Sprint(MaxDeferredDevice)) {
			t.Fatalf("error %q does not give the limit %d", err, MaxDeferredDevice)
		}
	}
	if txID(t, s) != before {
		t.Fatal("a refused enqueue wrote a transaction")
	}
	if MaxDeferredDevice != bolt.MaxKeySize-18 {
		t.Fatalf("MaxDeferredDevice %d, want bbolt's key limit less 18", MaxDeferredDevice)
	}
}

func TestDeferredAfterClose(t *testing.T) {
	s := open(t, t.TempDir())
	if err := s.Enqueue("d", 1, []byte("r")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := s.Enqueue("d", 2, []byte("r")); !errors.Is(err, ErrClosed) {
		t.Fatalf("enqueue after close: %v, want ErrClosed", err)
	}
	if err := s.DeleteDeferred([]DeferredKey{{"d", 1}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("delete after close: %v, want ErrClosed", err)
	}
	if err := s.LoadDeferred(func(string, uint64, []byte) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("load after close: %v, want ErrClosed", err)
	}
	if _, _, err := s.DeferredStats(); !errors.Is(err, ErrClosed) {
		t.Fatalf("stats after close: %v, want ErrClosed", err)
	}
}

// holdWriter begins a write transaction on s, so that the committer
// waits for it, and returns the function that ends it.
func holdWriter(t *testing.T, s *Store) (release func()) {
	t.Helper()
	tx, err := s.db.Begin(true)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { tx.Rollback() }) }
	t.Cleanup(release)
	return release
}

// waitPending waits until n requests are queued or in a transaction.
// The requests are goroutines about to queue: yielding lets them run.
func waitPending(s *Store, n int64) {
	for s.commit.pending.Load() < n {
		runtime.Gosched()
	}
}

// TestEnqueueSharesTransactions holds the writer while many enqueues
// queue up: once it is released they take two transactions, the one
// the committer had started with the first of them, and one for all
// the rest.
func TestEnqueueSharesTransactions(t *testing.T) {
	s := open(t, t.TempDir())
	if err := s.Enqueue("warm-up", 0, nil); err != nil {
		t.Fatal(err)
	}
	before := txID(t, s)
	release := holdWriter(t, s)
	const n = 100
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = s.Enqueue(fmt.Sprintf("d%03d", i), 1, []byte("r")) })
	}
	waitPending(s, n)
	release()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("enqueue %d: %v", i, err)
		}
	}
	if txs := txID(t, s) - before; txs > 2 {
		t.Fatalf("%d enqueues took %d transactions, want at most 2", n, txs)
	}
	if got, _, _ := s.DeferredStats(); got != n+1 {
		t.Fatalf("%d messages stored, want %d", got, n+1)
	}
}

// TestEnqueueFailureIsolated makes one message of a group commit fail to
// write (its key holds a bucket, as in a damaged file): that enqueue
// fails and stores nothing, the others of the same transaction succeed.
func TestEnqueueFailureIsolated(t *testing.T) {
	s := open(t, t.TempDir())
	err := s.update(func(tx *bolt.Tx) error {
		_, err := tx.Bucket(bucketDeferred).CreateBucket(appendDeferredKey(nil, "bad", 5))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	release := holdWriter(t, s)
	const n = 20
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			d := fmt.Sprintf("d%02d", i)
			if i == n/2 {
				d = "bad"
			}
			errs[i] = s.Enqueue(d, 5, []byte("r"))
		})
	}
	waitPending(s, n)
	release()
	wg.Wait()
	for i, err := range errs {
		if i == n/2 {
			if err == nil || !strings.Contains(err.Error(), s.Path()) {
				t.Fatalf("enqueue over a bucket: got %v, want an error naming the file", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("enqueue %d: %v", i, err)
		}
	}
	if got, _, _ := s.DeferredStats(); got != n-1 {
		t.Fatalf("%d messages stored, want %d", got, n-1)
	}
	// The bucket in place of a message is a corrupt file for a load.
	err = s.LoadDeferred(func(string, uint64, []byte) error { return nil })
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), s.Path()) {
		t.Fatalf("load: got %v, want ErrCorrupt naming the file", err)
	}
}

// TestCloseDuringEnqueues closes the store while enqueues run: each one
// either succeeds, and its message is in the file, or fails with
// ErrClosed and is not; none hangs.
func TestCloseDuringEnqueues(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	const publishers, each = 20, 50
	var wg sync.WaitGroup
	results := make([][]error, publishers)
	started := make(chan struct{}, publishers)
	for p := range publishers {
		wg.Go(func() {
			started <- struct{}{}
			for seq := range each {
				err := s.Enqueue(fmt.Sprintf("d%02d", p), uint64(seq), []byte("r"))
				results[p] = append(results[p], err)
			}
		})
	}
	for range publishers {
		<-started
	}
	if err := s.Enqueue("first", 0, []byte("r")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	s = open(t, dir)
	stored := map[DeferredKey]bool{}
	for _, m := range loadAll(t, s) {
		stored[DeferredKey{m.device, m.seq}] = true
	}
	acked, refused := 0, 0
	for p, errs := range results {
		for seq, err := range errs {
			k := DeferredKey{fmt.Sprintf("d%02d", p), uint64(seq)}
			switch {
			case err == nil && stored[k]:
				acked++
			case errors.Is(err, ErrClosed) && !stored[k]:
				refused++
			default:
				t.Fatalf("%v: error %v, stored %v", k, err, stored[k])
			}
		}
	}
	t.Logf("%d enqueues acked before close, %d refused", acked, refused)
}

// TestCloseCompletesQueuedEnqueues closes the store while enqueues wait
// for a writer: Close waits for them, and they are stored.
func TestCloseCompletesQueuedEnqueues(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	release := holdWriter(t, s)
	const n = 10
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = s.Enqueue("d", uint64(i), []byte("r")) })
	}
	waitPending(s, n)
	closed := make(chan error)
	go func() { closed <- s.Close() }()
	for !s.closed.Load() {
		runtime.Gosched()
	}
	if err := s.Enqueue("d", n, []byte("r")); !errors.Is(err, ErrClosed) {
		t.Fatalf("enqueue while closing: %v, want ErrClosed", err)
	}
	release()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("queued enqueue %d: %v", i, err)
		}
	}
	if got := len(loadAll(t, open(t, dir))); got != n {
		t.Fatalf("%d messages stored, want %d", got, n)
	}
}

func TestLoadDeferredErrors(t *testing.T) {
	s := open(t, t.TempDir())
	for seq := range uint64(3) {
		if err := s.Enqueue("d", seq, []byte("r")); err != nil {
			t.Fatal(err)
		}
	}
	stop := errors.New("stop")
	calls := 0
	err := s.LoadDeferred(func(string, uint64, []byte) error {
		calls++
		return stop
	})
	if !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("got %v after %d calls, want fn's error after 1", err, calls)
	}
	// A key no Enqueue writes: a device length beyond the key.
	bad := []byte{0x05, 'd', 0, 0, 0, 0, 0, 0, 0, 1}
	err = s.update(func(tx *bolt.Tx) error { return tx.Bucket(bucketDeferred).Put(bad, []byte("r")) })
	if err != nil {
		t.Fatal(err)
	}
	err = s.LoadDeferred(func(string, uint64, []byte) error { return nil })
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), s.Path()) {
		t.Fatalf("got %v, want ErrCorrupt naming %s", err, s.Path())
	}
}

// TestDeferredInOlderFile opens a file written before deferred messages,
// without the bucket: it holds none, and the first Enqueue creates it.
func TestDeferredInOlderFile(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	err := s.update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketDeferred) })
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, dir)
	if got := loadAll(t, s); len(got) != 0 {
		t.Fatalf("loaded %v from a file without deferred messages", got)
	}
	if n, size, err := s.DeferredStats(); n != 0 || size != 0 || err != nil {
		t.Fatalf("stats %d, %d, %v", n, size, err)
	}
	if err := s.DeleteDeferred([]DeferredKey{{"d", 1}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Enqueue("d", 1, []byte("r")); err != nil {
		t.Fatal(err)
	}
	if got := loadAll(t, s); !slices.Equal(got, []message{{"d", 1, "r"}}) {
		t.Fatalf("got %v", got)
	}
}

func TestDeferredKey(t *testing.T) {
	for _, tc := range []struct {
		device string
		seq    uint64
		want   []byte
	}{
		{"a", 1, []byte{1, 'a', 0, 0, 0, 0, 0, 0, 0, 1}},
		{"ab", math.MaxUint64, []byte{2, 'a', 'b', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
	} {
		k := appendDeferredKey(nil, tc.device, tc.seq)
		if !bytes.Equal(k, tc.want) {
			t.Fatalf("key of %q/%d: % x, want % x", tc.device, tc.seq, k, tc.want)
		}
		d, seq, err := decodeDeferredKey(k)
		if err != nil || string(d) != tc.device || seq != tc.seq {
			t.Fatalf("decoded % x to %q/%d, %v", k, d, seq, err)
		}
	}
	long := strings.Repeat("x", 200)
	if k := appendDeferredKey(nil, long, 0); !bytes.Equal(k[:2], []byte{0xc8, 0x01}) || len(k) != 2+200+8 {
		t.Fatalf("key of a 200-byte ID starts % x, %d bytes", k[:2], len(k))
	}
	for _, bad := range [][]byte{
		nil,
		{0}, // empty ID
		{0x81, 0x00, 'a', 0, 0, 0, 0, 0, 0, 0, 0},                    // non-minimal length
		{1, 'a', 0, 0, 0, 0, 0, 0, 0},                                // short seq
		{1, 'a', 0, 0, 0, 0, 0, 0, 0, 0, 0},                          // trailing byte
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, // huge length
		{0x80}, // truncated length
	} {
		if _, _, err := decodeDeferredKey(bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("decoding % x: %v, want ErrCorrupt", bad, err)
		}
	}
}

// TestSnapshotYieldsToEnqueues checks that a snapshot ends its
// transactions early while deferred messages wait, and lets their group
// commit go between its transactions.
func TestSnapshotYieldsToEnqueues(t *testing.T) {
	for _, yield := range []bool{false, true} {
		t.Run(fmt.Sprintf("yield=%v", yield), func(t *testing.T) {
			s := open(t, t.TempDir())
			tab := newTable(t, 10)
			clock := devicelimit.NewManualClock(t0)
			sn := NewSnapshotter(s, tab, clock, 0, nil)
			sn.yield = 0
			if yield {
				sn.yield = 1 // any time is long enough
			}
			const n = 3*yieldEvery + 10
			for i := range n {
				tab.AllowAt(fmt.Sprintf("dev-%04d", i), q, t0)
			}
			// A message waits for the whole snapshot, as far as the
			// snapshot can tell; others are enqueued, one at a time,
			// until it ends.
			s.commit.pending.Add(1)
			defer s.commit.pending.Add(-1)
			before := txID(t, s)
			var done atomic.Bool
			enqueued := make(chan int)
			go func() {
				seq := 0
				for ; !done.Load(); seq++ {
					if err := s.Enqueue("d", uint64(seq), []byte("r")); err != nil {
						t.Error(err)
						break
					}
				}
				enqueued <- seq
			}()
			st, err := sn.Snapshot()
			done.Store(true)
			msgs := <-enqueued
			if err != nil || st.Windows != n {
				t.Fatalf("snapshot %+v, %v; want %d windows", st, err, n)
			}
			snapshotTxs := txID(t, s) - before - msgs
			if want := map[bool]int{false: 1, true: 4}[yield]; snapshotTxs != want {
				t.Fatalf("%d snapshot transactions, want %d", snapshotTxs, want)
			}
			// Before each of its transactions after the first, the
			// snapshot waited for a group commit.
			if yield && msgs < snapshotTxs-1 {
				t.Fatalf("%d messages enqueued during %d snapshot transactions", msgs, snapshotTxs)
			}
			if got := len(stored(t, s)); got != n {
				t.Fatalf("%d windows stored, want %d", got, n)
			}
		})
	}
}
