package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// TestRecutRetryAfterExact: a window shortened by a quota change holds
// its counts in a bucket later than now (the end of the old newest
// bucket). A refusal then tells the time from now, not from that
// bucket's start, to when the window admits again: at now+RetryAfter
// it admits, a microsecond earlier it does not.
func TestRecutRetryAfterExact(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	l, _ := newLimiter(t, srv, 10, PolicyFailClosed, time.Second)
	long := devicelimit.Quota{Limit: 3, Window: 10 * time.Second}
	short := devicelimit.Quota{Limit: 3, Window: time.Second}
	// 1 ms into a bucket of 1 s: its end, where the re-cut puts the
	// counts, is 999 ms away.
	at := int64(t0)/1000 + 1000
	for i := range 3 {
		if d, err := l.evalAt(ctx, "d", long, true, at); err != nil || !d.Allowed {
			t.Fatalf("message %d: %+v, %v", i, d, err)
		}
	}
	d, err := l.evalAt(ctx, "d", short, true, at)
	if err != nil || d.Allowed {
		t.Fatalf("after the re-cut: %+v, %v; want refused", d, err)
	}
	retry := d.RetryAfter.Microseconds()
	if early, _ := l.evalAt(ctx, "d", short, false, at+retry-1); early.Remaining != 0 {
		t.Fatalf("RetryAfter %v too long: a microsecond before, %+v", d.RetryAfter, early)
	}
	if onTime, _ := l.evalAt(ctx, "d", short, false, at+retry); onTime.Remaining == 0 {
		t.Fatalf("RetryAfter %v too short: at now+RetryAfter still %+v", d.RetryAfter, onTime)
	}
}

// TestRecutAlternatingLengths: gateways that disagree on a device's
// window length (a rolling change of its rule) take turns deciding: the
// window is re-cut at every turn. Each re-cut keeps the counts' ages,
// to within a bucket, so they still expire: a device sending 10 per
// second against 5 per 1 s or 5 per 2 s gets at least what the longer
// quota allows, and never more than the shorter one allows.
func TestRecutAlternatingLengths(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	l, _ := newLimiter(t, srv, 20, PolicyFailClosed, time.Second)
	now := int64(t0) / 1000
	var admitted []devicelimit.Tick
	for i := range 200 { // 20 s
		q := devicelimit.Quota{Limit: 5, Window: time.Second}
		if i%2 == 1 {
			q.Window = 2 * time.Second
		}
		d, err := l.evalAt(ctx, "alt", q, true, now)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted = append(admitted, devicelimit.Tick(now*1000))
		}
		now += 100_000
	}
	checkWindows(t, admitted, devicelimit.Quota{Limit: 5, Window: time.Second}, "alternating lengths")
	if len(admitted) < 45 { // 5 per 2 s for 20 s: 50, less a bucket's drift
		t.Fatalf("%d admitted in 20 s at 5 per 1 s or 2 s, want at least 45 (5 per 2 s)", len(admitted))
	}
	t.Logf("%d admitted in 20 s", len(admitted))
}
