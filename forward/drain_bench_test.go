package forward

import (
	"context"
	"flag"
	"os"
	"runtime/pprof"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/persist"
)

// fillLog appends n messages of 64-byte payloads to f from 64
// goroutines (so that they share group commits), as devices would.
func fillLog(b *testing.B, f *Forwarder, n int) {
	b.Helper()
	payload := make([]byte, 64)
	var wg sync.WaitGroup
	const writers = 64
	for w := range writers {
		wg.Go(func() {
			for i := w; i < n; i += writers {
				if err := f.Append(&Message{Device: "dev-" + strconv.Itoa(w), Topic: "bench/" + strconv.Itoa(w), QoS: 1, Payload: payload}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// drainProfile names a file for a CPU profile of the drain alone (the
// log already filled): go test -run X -bench Drain -drainprofile FILE.
var drainProfile = flag.String("drainprofile", "", "write a CPU profile of BenchmarkDrain's drain alone to this file")

// BenchmarkDrain measures how fast a backlog of b.N messages leaves
// the forward log for a real Mosquitto once the upstream is back
// (messages/s in the drain/s metric, and this process's CPU time per
// message in cpu-µs/msg), with the default window of 100
// messages in flight and with 1000. In live, devices go on publishing
// during the drain (b.N more messages from 16 goroutines): the
// forwarder's deletions then ride in the appends' transactions. tx/msg
// counts the data file's transactions per message forwarded, and
// deletions-only-tx/msg those that carried deletions alone.
func BenchmarkDrain(b *testing.B) {
	for _, window := range []int{100, 1000} {
		b.Run("window="+strconv.Itoa(window), func(b *testing.B) { benchDrain(b, window, false) })
	}
	b.Run("window=100/live", func(b *testing.B) { benchDrain(b, 100, true) })
}

func benchDrain(b *testing.B, window int, live bool) {
	up := mosquittotest.Start(b)
	up.Stop()
	st, err := persist.Open(b.TempDir(), persist.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	f, err := New(Config{Name: "up/0", Dial: &MQTT{Address: up.Addr, ClientID: "gw"}, MaxQoS: 1, Window: window,
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}, st, nil)
	if err != nil {
		b.Fatal(err)
	}
	fillLog(b, f, b.N)
	up.Restart()
	b.ResetTimer()
	if *drainProfile != "" {
		out, err := os.Create(*drainProfile)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(out); err != nil {
			b.Fatal(err)
		}
		defer func() { pprof.StopCPUProfile(); out.Close() }()
	}
	cpu0, tx0 := cpuTime(b), st.Commits()
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	n := b.N
	if live {
		fillLog(b, f, b.N) // while the forwarder drains
		n += b.N
	}
	for f.Stats().Backlog > 0 {
		time.Sleep(time.Millisecond) // polling the backlog
	}
	tx := st.Commits()
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "drain/s")
	b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/float64(n), "cpu-µs/msg")
	b.ReportMetric(float64(tx.Transactions-tx0.Transactions)/float64(n), "tx/msg")
	b.ReportMetric(float64(tx.DeletionsOnly-tx0.DeletionsOnly)/float64(n), "deletions-only-tx/msg")
}

// cpuTime is the CPU time (user and system) this process has used: a
// benchmark's CPU per message holds on a shared machine where its
// messages per second do not.
func cpuTime(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
