package persist

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// The benchmarks work on a million devices with the default 20 buckets
// and a 100/10s quota, IDs like those of devicelimit's benchmarks:
//
//	go test -run '^$' -bench . -benchmem ./persist/

const benchDevices = 1_000_000

var benchQuota = devicelimit.Quota{Limit: 100, Window: 10 * time.Second}

var benchIDs = sync.OnceValue(func() []string {
	ids := make([]string, benchDevices)
	for i := range ids {
		ids[i] = fmt.Sprintf("device-%08d", i)
	}
	return ids
})

// benchTable returns a table where every device has a dirty window.
func benchTable(b *testing.B, now devicelimit.Tick) *devicelimit.Table {
	b.Helper()
	tab := newTable(b, devicelimit.DefaultBuckets)
	dirtyAll(tab, now)
	return tab
}

// dirtyAll admits one message for every device at now.
func dirtyAll(tab *devicelimit.Table, now devicelimit.Tick) {
	for _, id := range benchIDs() {
		tab.AllowAt(id, benchQuota, now)
	}
}

func benchStore(b *testing.B) *Store {
	b.Helper()
	s, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

func fileSize(b *testing.B, s *Store) int64 {
	fi, err := os.Stat(s.Path())
	if err != nil {
		b.Fatal(err)
	}
	return fi.Size()
}

// BenchmarkSnapshot1M measures one snapshot of a million changed windows:
// collection, sorting and the bbolt transactions, fsync included. In
// "new" the devices are new to the file, in "update" they replace the
// windows the previous snapshot wrote.
func BenchmarkSnapshot1M(b *testing.B) {
	b.Run("new", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			s := benchStore(b)
			clock := devicelimit.NewManualClock(t0)
			tab := benchTable(b, t0)
			sn := NewSnapshotter(s, tab, clock, 0, nil)
			runtime.GC()
			b.StartTimer()
			st, err := sn.Snapshot()
			if err != nil || st.Windows != benchDevices {
				b.Fatalf("snapshot %+v, %v", st, err)
			}
			b.StopTimer()
			b.ReportMetric(float64(fileSize(b, s))/1e6, "file-MB")
			s.Close()
			b.StartTimer()
		}
	})
	b.Run("update", func(b *testing.B) {
		b.ReportAllocs()
		s := benchStore(b)
		clock := devicelimit.NewManualClock(t0)
		tab := benchTable(b, t0)
		sn := NewSnapshotter(s, tab, clock, 0, nil)
		if _, err := sn.Snapshot(); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			dirtyAll(tab, clock.Advance(time.Second))
			runtime.GC()
			b.StartTimer()
			st, err := sn.Snapshot()
			if err != nil || st.Windows != benchDevices {
				b.Fatalf("snapshot %+v, %v", st, err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(fileSize(b, s))/1e6, "file-MB")
	})
}

// BenchmarkRestore1M measures reading a million windows into a new table.
func BenchmarkRestore1M(b *testing.B) {
	b.ReportAllocs()
	s := benchStore(b)
	sn := NewSnapshotter(s, benchTable(b, t0), devicelimit.NewManualClock(t0), 0, nil)
	if _, err := sn.Snapshot(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		tab := newTable(b, devicelimit.DefaultBuckets)
		runtime.GC()
		b.StartTimer()
		n, err := s.RestoreWindows(tab)
		if err != nil || n != benchDevices {
			b.Fatalf("restored %d, %v", n, err)
		}
	}
}

// latencies is a histogram of durations in nanoseconds: exact below
// 64 µs, longer ones kept in a list.
type latencies struct {
	counts [1 << 16]uint32
	long   []int64
	n      int
}

func (l *latencies) add(ns int64) {
	l.n++
	if ns < int64(len(l.counts)) {
		l.counts[ns]++
		return
	}
	l.long = append(l.long, ns)
}

// quantile returns the q-quantile in nanoseconds.
func (l *latencies) quantile(q float64) float64 {
	rank := int(q * float64(l.n-1))
	for ns, c := range l.counts {
		if rank < int(c) {
			return float64(ns)
		}
		rank -= int(c)
	}
	slices.Sort(l.long)
	return float64(l.long[min(rank, len(l.long)-1)])
}

// BenchmarkDecisionDuringSnapshot measures the latency of AllowAt over
// a million devices, with and without snapshots of the table running in
// a loop meanwhile. The first snapshot writes all million windows; the
// decisions (about one per device and second, under the 100/10s quota:
// admissions) dirty the windows again for the next ones.
func BenchmarkDecisionDuringSnapshot(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("snapshot=%s", map[bool]string{false: "off", true: "on"}[on]), func(b *testing.B) {
			s := benchStore(b)
			clock := devicelimit.NewManualClock(t0)
			tab := benchTable(b, t0)
			sn := NewSnapshotter(s, tab, clock, 0, nil)
			ids := benchIDs()
			lat := new(latencies)
			var stop atomic.Bool
			var snapshots atomic.Int64
			var wg sync.WaitGroup
			runtime.GC()
			b.ReportAllocs()
			b.ResetTimer()
			if on {
				wg.Go(func() {
					for !stop.Load() {
						if _, err := sn.Snapshot(); err != nil {
							b.Error(err)
							return
						}
						snapshots.Add(1)
					}
				})
			}
			for i := 0; i < b.N; i++ {
				id := ids[(i*7919)%len(ids)]
				now := clock.Now()
				start := time.Now()
				tab.AllowAt(id, benchQuota, now)
				lat.add(int64(time.Since(start)))
				if i%1024 == 0 {
					clock.Advance(time.Millisecond)
				}
			}
			b.StopTimer()
			stop.Store(true)
			wg.Wait()
			b.ReportMetric(lat.quantile(0.5), "p50-ns")
			b.ReportMetric(lat.quantile(0.99), "p99-ns")
			b.ReportMetric(lat.quantile(0.999), "p999-ns")
			b.ReportMetric(float64(snapshots.Load()), "snapshots")
		})
	}
}
