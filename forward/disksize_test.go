package forward

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/poll"
)

// maxBytesOnDisk is how many times MaxBytes a data file holding one
// forward log under DropOldest may take on disk (docs/forwarding-failures.md,
// "Health on a full disk"), plus maxBytesOnDiskFixed: bbolt's pages
// (page headers, leaves split half full, branch pages), the free pages a
// trim leaves for the next appends and the freelist.
const (
	maxBytesOnDisk      = 3
	maxBytesOnDiskFixed = 1 << 20
)

// TestMaxBytesOnDisk measures what a forward log bounded by MaxBytes
// takes on disk: its upstream down, messages of 100 B and of 2 KiB
// appended, six times the bound, in group commits of a sixteenth of it,
// while the pump drops the oldest. The data file's blocks on disk (what fills it) stay within
// maxBytesOnDisk times MaxBytes plus maxBytesOnDiskFixed; its length
// (sparse: bbolt grows it ahead) is reported.
func TestMaxBytesOnDisk(t *testing.T) {
	const bound = 2 << 20
	for _, payload := range []int{100, 2048} {
		f, st := overflowForwarder(t, bound, DropOldest)
		p := strings.Repeat("x", payload)
		rec := int64(len(appendRecord(nil, &Message{Device: "dev-1", At: time.Now(), Topic: "devices/d/t", QoS: 1, Payload: []byte(p)})))
		var peak int64
		chunk := bound / 16 / rec // what devices publish while the pump trims once or twice
		for round := range 96 {
			appendBatch(t, f, int(chunk), func(int) string { return p })
			fi, err := os.Stat(st.Path())
			if err != nil {
				t.Fatal(err)
			}
			blocks := fi.Sys().(*syscall.Stat_t).Blocks * 512
			peak = max(peak, blocks)
			if round == 95 {
				t.Logf("payload %d B (records of %d B): file %d bytes long, %d on disk (peak %d): %.2f times max_bytes %d; the log %d bytes",
					payload, rec, fi.Size(), blocks, peak, float64(peak)/bound, bound, f.Stats().BacklogBytes)
			}
		}
		poll.Until(t, 20*time.Second, "the log trimmed to its bound", func() bool { return f.Stats().BacklogBytes <= bound })
		if peak > maxBytesOnDisk*bound+maxBytesOnDiskFixed {
			t.Errorf("payload %d B: the data file took %d bytes on disk, over %d times max_bytes %d plus %d", payload, peak, maxBytesOnDisk, bound, maxBytesOnDiskFixed)
		}
	}
}
