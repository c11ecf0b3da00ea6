package forward

import (
	"context"
	"strconv"
	"sync"
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

// BenchmarkDrain measures how fast a backlog of b.N messages leaves
// the forward log for a real Mosquitto once the upstream is back
// (messages/s in the drain/s metric), with the default window of 100
// messages in flight and with 1000.
func BenchmarkDrain(b *testing.B) {
	for _, window := range []int{100, 1000} {
		b.Run("window="+strconv.Itoa(window), func(b *testing.B) { benchDrain(b, window) })
	}
}

func benchDrain(b *testing.B, window int) {
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
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	for f.Stats().Backlog > 0 {
		time.Sleep(time.Millisecond) // polling the backlog
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "drain/s")
}
