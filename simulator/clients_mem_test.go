package simulator

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestDeviceClientHeap bounds what one simulated MQTT 5 device costs the
// simulator's heap. paho.golang sizes each client's queue of incoming
// publishes by the Receive Maximum the client announces, 65535 when it
// announces none: 512 KiB a device, 4.9 GiB for `make sim-10k`'s 10 000
// devices, which starved the simulator's own subscriber (issue 13). A
// device receives nothing, so it announces a small one.
func TestDeviceClientHeap(t *testing.T) {
	addr := startGateway(t, devicelimit.Quota{Limit: 100, Window: time.Second})
	const n = 200
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	clients := make([]*client5, 0, n)
	for i := range n {
		c, err := dial5(context.Background(), addr, fmt.Sprintf("heap-%d", i), 1, Auth{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	perDevice := (heap() - before) / n
	for _, c := range clients {
		c.close()
	}
	t.Logf("%d KiB of heap per connected device (simulator side, gateway in the same process)", perDevice>>10)
	// The gateway's side of each connection is in this heap too (about
	// 90 KiB with mochi's default pending-write queue).
	if perDevice > 256<<10 {
		t.Fatalf("%d KiB of heap per device; want at most 256 KiB", perDevice>>10)
	}
}
