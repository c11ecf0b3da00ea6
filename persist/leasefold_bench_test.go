package persist

import (
	"fmt"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
)

// BenchmarkLeaseLogFold is one fold of the lease log in a fleet whose
// every device has a lease record: a quarter of the fleet's entries
// (what a lease write folds past the threshold, leaselog.go), logged in
// values of 20 as lease writes append them, folded into the records in
// one transaction with its commit and fsync. An op is that transaction:
// how long it holds the data file's group commit (deferred messages and
// forward logs wait behind it).
//
//	go test -run '^$' -bench LeaseLogFold -benchtime 5x ./persist
func BenchmarkLeaseLogFold(b *testing.B) {
	win, err := devicelimit.Window{Length: 10 * time.Second, Head: 3, Counts: make([]uint32, devicelimit.DefaultBuckets)}.MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	for _, devices := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("devices=%d", devices), func(b *testing.B) {
			s := benchStore(b)
			keys := make([]string, devices)
			for i := range keys {
				keys[i] = fmt.Sprintf("device-%06d", i)
			}
			adm := uint64(0)
			logPart := func(from, n int) {
				b.Helper()
				for i := 0; i < n; i += 20 {
					var value []byte
					for j := i; j < min(n, i+20); j++ {
						adm++
						value = appendLogEntry(value, keys[(from+j)%devices], devicelimit.Lease{Inc: 1, Cap: adm + 1, Length: 10 * time.Second, Adm: adm, Window: win})
					}
					if err := s.update(func(tx *bolt.Tx) error { return appendLeaseLog(tx, value) }); err != nil {
						b.Fatal(err)
					}
				}
			}
			fold := func(limit int) {
				b.Helper()
				if err := s.update(func(tx *bolt.Tx) error { _, _, err := foldLeaseLog(tx, limit); return err }); err != nil {
					b.Fatal(err)
				}
			}
			logPart(0, devices) // every device has its record
			fold(-1)
			part := devices / 4
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				logPart(i*part, part)
				b.StartTimer()
				fold(part)
			}
		})
	}
}
