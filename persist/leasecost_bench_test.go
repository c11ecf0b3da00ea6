package persist

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// BenchmarkQuietFleetLeases is make sim-10k's fleet in process: 10,000
// devices on a quota of 5 per 10 s (a lease of 1), each publishing once
// every 5 s, a snapshot every second. An op is one second of it (2,000
// admissions, then, with leases on, the wait for their leases, and a
// snapshot); leases=on and leases=off run side by side, and report the process's
// CPU time (user and system) per op, the windows each snapshot wrote,
// and the lease records and lease transactions per second. The fleet's
// admissions ask their leases early and wait for none; the leaser
// writes such leases lazyAfter after they are asked, which in real time
// is up to 5 transactions a second, but an op takes less than a second:
// each op therefore ends with a new device's first admission, which
// waits for its lease, so that the write it wakes takes the op's leases
// (one transaction per op). With writes=45 the op's admissions are cut
// in 45 parts, each ended by such a newcomer: 45 lease transactions a
// second, as make bench-lease's gateway writes them (42 to 47 a
// second), each of some 45 records.
//
//	go test -run '^$' -bench QuietFleetLeases -benchtime 20x ./persist
func BenchmarkQuietFleetLeases(b *testing.B) {
	const devices, every = 10_000, 5
	q := devicelimit.Quota{Limit: 5, Window: 10 * time.Second}
	ids := make([]string, devices)
	for i := range ids {
		ids[i] = fmt.Sprintf("device-%05d", i)
	}
	for _, c := range []struct {
		on     bool
		writes int
	}{{true, 1}, {true, 45}, {false, 0}} {
		on := c.on
		name := "leases=off"
		if on {
			name = fmt.Sprintf("leases=on/writes=%d", c.writes)
		}
		b.Run(name, func(b *testing.B) {
			s := benchStore(b)
			tab := newTable(b, devicelimit.DefaultBuckets)
			var l *Leaser
			if on {
				tab.EnableLeases(devicelimit.DefaultLeasePolicy)
				l = NewLeaser(s, tab, nil)
				defer l.Close(context.Background())
			}
			clock := &stepClock{now: t0}
			sn := NewSnapshotter(s, tab, clock, time.Hour, nil)
			windows, sec := 0, 0
			second := func() {
				var last uint32
				part := 0
				for n, i := 0, sec%every; i < devices; n, i = n+1, i+every {
					clock.now = clock.now.Add(time.Second / (devices / every))
					if d := tab.AllowAt(ids[i], q, clock.now); d.Lease != 0 {
						last = d.Lease
					}
					if on && (n+1)*c.writes/(devices/every) > part {
						// The latest batch: its write takes the part's leases.
						part++
						last = tab.AllowAt(fmt.Sprint("newcomer-", sec, "-", part), q, clock.now).Lease
						if !tab.WaitLease(last, 5*time.Second) {
							b.Fatal("leases not written")
						}
					}
				}
				if !tab.WaitLease(last, 5*time.Second) {
					b.Fatal("leases not written")
				}
				st, err := sn.Snapshot()
				if err != nil {
					b.Fatal(err)
				}
				windows += st.Windows
				sec++
			}
			for range 2 * every { // every device published twice
				second()
			}
			windows = 0
			var writes0, records0 uint64
			if l != nil {
				writes0, records0 = l.Stats()
			}
			cpu0 := cpuTime(b)
			b.ResetTimer()
			for range b.N {
				second()
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime(b)-cpu0).Milliseconds())/float64(b.N), "cpu-ms/op")
			b.ReportMetric(float64(windows)/float64(b.N), "windows/snapshot")
			if l != nil {
				writes, records := l.Stats()
				b.ReportMetric(float64(records-records0)/float64(b.N), "lease-records/s")
				b.ReportMetric(float64(writes-writes0)/float64(b.N), "lease-txns/s")
			}
		})
	}
}

// cpuTime returns the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
