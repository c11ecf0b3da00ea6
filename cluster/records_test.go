package cluster

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/logtest"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// TestLimiterUnreadableRecord: window keys Redis holds but the script
// cannot read (garbage, another type, a record of another layout) are
// a problem of those devices alone. Their decisions follow the failure
// policy, counted and logged with the device; every other device's
// decision, in the same script call or pipeline, is Redis's, and Redis
// is not taken for down.
func TestLimiterUnreadableRecord(t *testing.T) {
	for _, multi := range []bool{true, false} {
		t.Run(map[bool]string{true: "one-call", false: "pipelined"}[multi], func(t *testing.T) {
			testUnreadableRecord(t, multi)
		})
	}
}

func testUnreadableRecord(t *testing.T, multi bool) {
	srv := redistest.Start(t)
	var logs syncBuffer
	l, _ := newLimiter(t, srv, 20, PolicyFailClosed, time.Second)
	l.multi = multi
	l.health.log = slog.New(slog.NewTextHandler(&logs, nil))
	ctx := context.Background()
	c := srv.Client()
	// A header claiming 3-byte counters, and one whose body is short.
	hdr := func(width byte, buckets uint16, body int) string {
		b := binary.LittleEndian.AppendUint64(nil, 1)
		b = binary.LittleEndian.AppendUint64(b, 1)
		b = binary.LittleEndian.AppendUint64(b, uint64(10*time.Second/time.Microsecond))
		b = binary.LittleEndian.AppendUint64(b, 0)
		b = binary.LittleEndian.AppendUint32(b, 0)
		b = binary.LittleEndian.AppendUint32(b, 5)
		b = binary.LittleEndian.AppendUint16(b, buckets)
		b = append(b, width)
		return string(append(b, make([]byte, body)...))
	}
	bad := map[string]func() error{
		"garbage":    func() error { return c.Set(ctx, l.windowKey("garbage"), "x", 0).Err() },
		"hash":       func() error { return c.HSet(ctx, l.windowKey("hash"), "f", "v").Err() },
		"width-3":    func() error { return c.Set(ctx, l.windowKey("width-3"), hdr(3, 20, 63), 0).Err() },
		"short-body": func() error { return c.Set(ctx, l.windowKey("short-body"), hdr(1, 20, 5), 0).Err() },
	}
	for dev, write := range bad {
		if err := write(); err != nil {
			t.Fatalf("write %s: %v", dev, err)
		}
	}
	q := devicelimit.Quota{Limit: 1000, Window: time.Hour}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 40 {
				if i%4 == 0 {
					dev := []string{"garbage", "hash", "width-3", "short-body"}[(g+i/4)%4]
					if d := l.AllowAt(dev, q, 0); d.Allowed {
						t.Errorf("%s (unreadable record) admitted under fail-closed: %+v", dev, d)
					}
					continue
				}
				if d := l.AllowAt(fmt.Sprint("good-", g), q, 0); !d.Allowed {
					t.Errorf("good-%d refused beside unreadable records: %+v (stats %+v)", g, d, l.Stats())
				}
			}
		})
	}
	wg.Wait()
	if st := l.Stats(); !st.Up || st.Fallbacks != 16*10 {
		t.Fatalf("stats %+v: want Redis up and %d fallbacks (the unreadable records' decisions)", st, 16*10)
	}
	for g := range 16 {
		if d, err := l.Peek(ctx, fmt.Sprint("good-", g), q); err != nil || d.Count != 30 {
			t.Fatalf("good-%d: count %d in Redis (%v), want 30", g, d.Count, err)
		}
	}
	if n, err := c.HLen(ctx, l.windowKey("hash")).Result(); err != nil || n != 1 {
		t.Fatalf("the hash under a window key was changed: %d fields, %v", n, err)
	}
	out := logs.String()
	if !strings.Contains(out, "unreadable") || strings.Count(out, "\n") > 4 {
		t.Fatalf("log:\n%s\nwant at most a line per unreadable record, naming it", out)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer = logtest.Buffer
