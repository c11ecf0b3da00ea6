package persist

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
)

// BenchmarkEnqueue measures durable enqueues of 100-byte records from
// concurrent publishers, each a goroutine enqueueing for its own device
// with increasing seq and waiting for each enqueue (as a QoS 1 publisher
// waits for its PUBACK):
//
//	go test -run '^$' -bench 'Enqueue$' ./persist/
//
// Modes: "group" is Store.Enqueue; "tx-per-message" is one db.Update,
// one fsync, per message; "bbolt-batch-<delay>" is bbolt's DB.Batch with
// that MaxBatchDelay (10ms is bbolt's default), for comparison.
func BenchmarkEnqueue(b *testing.B) {
	type mode struct {
		name    string
		enqueue func(s *Store) func(device string, seq uint64, rec []byte) error
	}
	put := func(tx *bolt.Tx, device string, seq uint64, rec []byte) error {
		return tx.Bucket(bucketDeferred).Put(appendDeferredKey(nil, device, seq), rec)
	}
	batch := func(delay time.Duration) mode {
		return mode{fmt.Sprintf("bbolt-batch-%v", delay), func(s *Store) func(string, uint64, []byte) error {
			s.db.MaxBatchDelay = delay
			return func(device string, seq uint64, rec []byte) error {
				return s.db.Batch(func(tx *bolt.Tx) error { return put(tx, device, seq, rec) })
			}
		}}
	}
	modes := []mode{
		{"group", func(s *Store) func(string, uint64, []byte) error { return s.Enqueue }},
		{"tx-per-message", func(s *Store) func(string, uint64, []byte) error {
			return func(device string, seq uint64, rec []byte) error {
				return s.db.Update(func(tx *bolt.Tx) error { return put(tx, device, seq, rec) })
			}
		}},
		batch(10 * time.Millisecond),
		batch(time.Millisecond),
		batch(200 * time.Microsecond),
	}
	for _, m := range modes {
		for _, publishers := range []int{1, 50, 500} {
			b.Run(fmt.Sprintf("mode=%s/publishers=%d", m.name, publishers), func(b *testing.B) {
				s := benchStore(b)
				benchPublishers(b, s, publishers, m.enqueue(s))
			})
		}
	}
}

// benchPublishers runs b.N enqueues from publishers goroutines and
// reports the rate, the latency and the messages per transaction.
func benchPublishers(b *testing.B, s *Store, publishers int, enqueue func(string, uint64, []byte) error) {
	rec := make([]byte, 100)
	lat := make([][]time.Duration, publishers)
	var next atomic.Int64
	var wg sync.WaitGroup
	before := txID(b, s)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for p := range publishers {
		device := fmt.Sprintf("device-%08d", p)
		wg.Go(func() {
			for seq := uint64(0); next.Add(1) <= int64(b.N); seq++ {
				t := time.Now()
				if err := enqueue(device, seq, rec); err != nil {
					b.Error(err)
					return
				}
				lat[p] = append(lat[p], time.Since(t))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "enqueues/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(b.N)/float64(txID(b, s)-before), "msgs/tx")
}

// BenchmarkEnqueueDuringSnapshot measures the latency of enqueues from
// 50 publishers while snapshots of a million changed windows run; each
// iteration is one snapshot. The snapshot holds bbolt's only writer for
// a transaction at a time, so an enqueue can wait for a whole chunk.
//
//	go test -run '^$' -bench EnqueueDuringSnapshot -benchtime 5x ./persist/
func BenchmarkEnqueueDuringSnapshot(b *testing.B) {
	for _, c := range []struct {
		chunk int
		yield time.Duration
	}{
		{defaultChunk, 0},
		{20_000, 0},
		{defaultChunk, 25 * time.Millisecond},
		{defaultChunk, yieldAfter},
		{defaultChunk, 5 * time.Millisecond},
	} {
		yield := "off"
		if c.yield > 0 {
			yield = c.yield.String()
		}
		b.Run(fmt.Sprintf("chunk=%d/yield=%s", c.chunk, yield), func(b *testing.B) {
			benchEnqueueDuringSnapshot(b, c.chunk, c.yield)
		})
	}
}

func benchEnqueueDuringSnapshot(b *testing.B, chunk int, yield time.Duration) {
	const publishers = 50
	s := benchStore(b)
	clock := devicelimit.NewManualClock(t0)
	tab := benchTable(b, t0)
	sn := NewSnapshotter(s, tab, clock, 0, nil)
	sn.chunk = chunk
	sn.yield = yield
	if _, err := sn.Snapshot(); err != nil { // the windows exist: snapshots update them
		b.Fatal(err)
	}
	var (
		measuring atomic.Bool
		stop      atomic.Bool
		during    atomic.Int64 // enqueues completed during snapshots
		wg        sync.WaitGroup
		mu        sync.Mutex
		lat       []time.Duration
	)
	rec := make([]byte, 100)
	for p := range publishers {
		device := fmt.Sprintf("publisher-%02d", p)
		wg.Go(func() {
			var mine []time.Duration
			for seq := uint64(0); !stop.Load(); seq++ {
				on := measuring.Load()
				t := time.Now()
				if err := s.Enqueue(device, seq, rec); err != nil {
					b.Error(err)
					return
				}
				d := time.Since(t)
				if on || measuring.Load() {
					mine = append(mine, d)
					during.Add(1)
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	var snapTime time.Duration
	var txs int
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		dirtyAll(tab, clock.Advance(time.Second))
		b.StartTimer()
		before := txID(b, s)
		measuring.Store(true)
		start := time.Now()
		st, err := sn.Snapshot()
		snapTime += time.Since(start)
		measuring.Store(false)
		txs += txID(b, s) - before
		if err != nil || st.Windows != benchDevices {
			b.Fatalf("snapshot %+v, %v", st, err)
		}
	}
	b.StopTimer()
	stop.Store(true)
	wg.Wait()
	slices.Sort(lat)
	b.ReportMetric(float64(snapTime.Milliseconds())/float64(b.N), "snapshot-ms")
	b.ReportMetric(float64(during.Load())/snapTime.Seconds(), "enqueues/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
	b.ReportMetric(float64(txs)/float64(b.N), "txs/snapshot")
}

// BenchmarkDeleteDeferred measures deleting 200,000 stored messages of
// 2,000 devices in one DeleteDeferred call: transactions of deleteChunk
// keys, each of which enqueues sharing the group commit wait for.
func BenchmarkDeleteDeferred(b *testing.B) {
	const devices, each = 2000, 100
	rec := make([]byte, 100)
	var keys []DeferredKey
	for d := range devices {
		for seq := range uint64(each) {
			keys = append(keys, DeferredKey{fmt.Sprintf("device-%08d", d), seq})
		}
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		s := benchStore(b)
		err := s.update(func(tx *bolt.Tx) error {
			bk := tx.Bucket(bucketDeferred)
			for _, k := range keys {
				if err := bk.Put(appendDeferredKey(nil, k.Device, k.Seq), rec); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		before := txID(b, s)
		b.StartTimer()
		start := time.Now()
		if err := s.DeleteDeferred(keys); err != nil {
			b.Fatal(err)
		}
		took := time.Since(start)
		b.StopTimer()
		txs := txID(b, s) - before
		b.ReportMetric(float64(len(keys))/took.Seconds(), "deletes/s")
		b.ReportMetric(float64(took.Microseconds())/1000/float64(txs), "ms/tx")
		if n, _, _ := s.DeferredStats(); n != 0 {
			b.Fatalf("%d messages left", n)
		}
		s.Close()
		b.StartTimer()
	}
}
