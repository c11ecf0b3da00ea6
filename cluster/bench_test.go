package cluster

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// BenchmarkDecisions compares, on one redis-server in one run, our
// shared window (a Lua script call decides the decisions that arrived
// together) with github.com/go-redis/redis_rate/v10 (GCRA, one EVALSHA
// round trip per decision), at 1 and 16 concurrent callers. Both enforce
// 100 messages per 10 s on the same 10 000 devices asked in the same
// order, so each device is asked about every 10 000 decisions: admissions
// for the first 100 rounds, refusals after.
//
//	go test -run '^$' -bench Decisions -benchmem -count 6 ./cluster/ > cluster.bench
//	benchstat -col /impl cluster.bench
func BenchmarkDecisions(b *testing.B) {
	srv := redistest.Start(b)
	const devices = 10_000
	ids := make([]string, devices)
	for i := range ids {
		ids[i] = fmt.Sprint("bench-", i)
	}
	q := devicelimit.Quota{Limit: 100, Window: 10 * time.Second}
	for _, callers := range []int{1, 16} {
		b.Run(fmt.Sprintf("impl=lua/callers=%d", callers), func(b *testing.B) {
			l, _ := newLimiter(b, srv, devicelimit.DefaultBuckets, PolicyFailClosed, 5*time.Second)
			run(b, srv, callers, func(i uint64) bool { return l.AllowAt(ids[i%devices], q, 0).Allowed })
			if st := l.Stats(); st.Fallbacks != 0 {
				b.Fatalf("%d decisions fell back to the policy", st.Fallbacks)
			}
		})
		two := devicelimit.WithWindows(devicelimit.PolicyDrop, devicelimit.Limit{N: 100, Window: 10 * time.Second},
			devicelimit.Limit{Unit: devicelimit.Bytes, N: 100_000, Window: time.Hour})
		b.Run(fmt.Sprintf("impl=lua-2windows/callers=%d", callers), func(b *testing.B) {
			l, _ := newLimiter(b, srv, devicelimit.DefaultBuckets, PolicyFailClosed, 5*time.Second)
			run(b, srv, callers, func(i uint64) bool { return l.AllowClassAt(ids[i%devices], "", two, 100, 0).Allowed })
			if st := l.Stats(); st.Fallbacks != 0 {
				b.Fatalf("%d decisions fell back to the policy", st.Fallbacks)
			}
		})
		b.Run(fmt.Sprintf("impl=redis_rate/callers=%d", callers), func(b *testing.B) {
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			defer rdb.Close()
			rl := redis_rate.NewLimiter(rdb)
			limit := redis_rate.Limit{Rate: q.Limit, Burst: q.Limit, Period: q.Window}
			ctx := context.Background()
			run(b, srv, callers, func(i uint64) bool {
				res, err := rl.Allow(ctx, ids[i%devices], limit)
				if err != nil {
					b.Fatal(err)
				}
				return res.Allowed > 0
			})
		})
	}
}

// run calls decide b.N times from callers goroutines (on a 2-core
// machine, RunParallel with parallelism callers/GOMAXPROCS) and reports
// decisions per second, and the CPU time per decision of redis-server
// and of this process together: on a machine shared with other work,
// CPU time is steadier than elapsed time.
func run(b *testing.B, srv *redistest.Server, callers int, decide func(i uint64) bool) {
	var next atomic.Uint64
	b.ReportAllocs()
	cpu0 := cpuTime(b, srv)
	b.ResetTimer()
	if callers == 1 {
		for i := range b.N {
			decide(uint64(i))
		}
	} else {
		b.SetParallelism(max(1, callers/gomaxprocs()))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				decide(next.Add(1))
			}
		})
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	b.StopTimer()
	b.ReportMetric(float64((cpuTime(b, srv)-cpu0).Nanoseconds())/float64(b.N)/1000, "cpu-µs/decision")
}

// cpuTime returns the CPU time used so far by redis-server (INFO cpu)
// and by this process (getrusage).
func cpuTime(b *testing.B, srv *redistest.Server) time.Duration {
	info, err := srv.Client().Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, k); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatalf("INFO cpu %q: %v", line, err)
				}
				total += f
			}
		}
	}
	return time.Duration(total*float64(time.Second)) + processCPU(b)
}

// processCPU returns the CPU time this process used so far
// (getrusage): its every goroutine's, background loops included.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
