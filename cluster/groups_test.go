package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// groupScriptSequences is how many random group sequences the script
// runs against the table.
const groupScriptSequences = 150

// TestScriptGroupsMatchTable: 2 to 4 devices of one group, each with
// random windows of its own and the group with random windows, in
// random modes (both enforced, both in shadow mode, one of them in
// shadow mode), through the script on a real redis-server at explicit
// times and through devicelimit.Table's AllowGroupAt at the same times:
// every decision (admitted, and whether the group refused) is the same,
// and what each part's windows counted never exceeds a window's limit
// in any interval of its length.
func TestScriptGroupsMatchTable(t *testing.T) {
	srv := redistest.Start(t)
	r := rand.New(rand.NewPCG(27, 28))
	ctx := context.Background()
	limiters := map[int]*Limiter{}
	tables := map[int]*devicelimit.Table{}
	decisions, refused, byGroup, tooLarge := 0, 0, 0, 0
	for seq := range groupScriptSequences {
		buckets := 1 + r.IntN(40)
		l := limiters[buckets]
		if l == nil {
			l, tables[buckets] = newLimiter(t, srv, buckets, PolicyFailClosed, time.Second)
			limiters[buckets] = l
		}
		tab := tables[buckets]
		mode := r.IntN(4) // 0 enforced, 1 both shadow, 2 device shadow, 3 group shadow
		gq := devicelimit.WithWindows(devicelimit.PolicyDrop, randomLimits(r, buckets)...)
		gq.Shadow = mode == 1 || mode == 3
		group := devicelimit.GroupKey(fmt.Sprint("tenant-", seq))
		type msg struct {
			at   devicelimit.Tick
			dev  int
			size int
		}
		var msgs []msg
		qs := make([]devicelimit.Quota, 2+r.IntN(3))
		for i := range qs {
			qs[i] = devicelimit.WithWindows(devicelimit.PolicyDrop, randomLimits(r, buckets)...)
			qs[i].Shadow = mode == 1 || mode == 2
			all := append(qs[i].Limits(), gq.Limits()...)
			shortest := all[0]
			for _, w := range all {
				if w.Window < shortest.Window {
					shortest = w
				}
			}
			for _, at := range arrivals(r, devicelimit.Quota{Limit: min(shortest.N, 40), Window: shortest.Window}, buckets) {
				// Whole microseconds: the script's clock.
				msgs = append(msgs, msg{at - at%1000, i, randomSize(r, all)})
			}
		}
		sort.SliceStable(msgs, func(i, j int) bool { return msgs[i].at < msgs[j].at })
		devCounted := make([][]sent, len(qs))
		grpCounted := make([][]sent, gq.NWindows)
		for i, m := range msgs {
			dev := fmt.Sprintf("dev-%d-%d", seq, m.dev)
			q := qs[m.dev]
			want := tab.AllowGroupAt(dev, "", q, group, gq, m.size, m.at)
			got, err := l.evalGroupAt(ctx, dev, "", q, group, gq, m.size, int64(m.at)/1000)
			if err != nil {
				t.Fatal(err)
			}
			if got.Allowed != want.Allowed || got.Group != want.Group || got.TooLarge != want.TooLarge {
				t.Fatalf("seq %d mode %d decision %d at +%v (device %d, %d bytes):\nscript %+v\ntable  %+v", seq, mode, i, m.at.Sub(t0), m.dev, m.size, got, want)
			}
			decisions++
			if got.TooLarge {
				tooLarge++
			}
			if !got.Allowed {
				refused++
				if got.Group {
					byGroup++
				}
			}
			// What each part counted, by the order of the parts.
			devCounts, grpCounts := got.Allowed, got.Allowed
			switch mode {
			case 2: // the group first: counted when it admitted
				grpCounts = got.Allowed || !got.Group
			case 3: // the device first
				devCounts = got.Allowed || got.Group
			}
			if devCounts {
				for _, w := range q.Limits() {
					devCounted[m.dev] = append(devCounted[m.dev], sent{m.at, w.Units(m.size)})
				}
			}
			if grpCounts {
				for k, w := range gq.Limits() {
					grpCounted[k] = append(grpCounted[k], sent{m.at, w.Units(m.size)})
				}
			}
		}
		for k, w := range gq.Limits() {
			checkSum(t, grpCounted[k], w, fmt.Sprintf("seq %d mode %d group window %d", seq, mode, k))
		}
		for i, q := range qs {
			for k, w := range q.Limits() {
				var own []sent
				for j := k; j < len(devCounted[i]); j += q.NWindows {
					own = append(own, devCounted[i][j])
				}
				checkSum(t, own, w, fmt.Sprintf("seq %d mode %d device %d window %d", seq, mode, i, k))
			}
		}
	}
	if refused == 0 || byGroup == 0 || byGroup == refused || tooLarge == 0 {
		t.Fatalf("%d decisions, %d refused, %d by the group, %d too large: the sequences do not exercise both parts", decisions, refused, byGroup, tooLarge)
	}
	t.Logf("%d sequences, %d decisions equal to devicelimit.Table's (%d refused, %d by the group, %d too large); every window's invariant held", groupScriptSequences, decisions, refused, byGroup, tooLarge)
}

// TestLimiterGroupConcurrent: 50 devices of one group on 16 goroutines,
// on Redis's clock, through the pipelines and in one script call: the
// group admits exactly its limit in all, each device at most its own.
func TestLimiterGroupConcurrent(t *testing.T) {
	for _, multi := range []bool{true, false} {
		t.Run(map[bool]string{true: "one-call", false: "pipelined"}[multi], func(t *testing.T) {
			srv := redistest.Start(t)
			l, _ := newLimiter(t, srv, 20, PolicyFailClosed, time.Second)
			l.multi = multi
			q := devicelimit.Quota{Limit: 5, Window: time.Hour}
			gq := devicelimit.Quota{Limit: 100, Window: time.Hour}
			key := devicelimit.GroupKey("acme")
			var admitted atomic.Int64
			perDevice := make([]atomic.Int64, 50)
			var wg sync.WaitGroup
			for g := range 16 {
				wg.Go(func() {
					for i := range 40 {
						dev := (g*40 + i) % 50
						if d := l.AllowGroupAt(fmt.Sprint("dev-", dev), "", q, key, gq, 10, 0); d.Allowed {
							admitted.Add(1)
							perDevice[dev].Add(1)
						}
					}
				})
			}
			wg.Wait()
			if got := admitted.Load(); got != 100 {
				t.Fatalf("the group admitted %d, want 100", got)
			}
			for i := range perDevice {
				if n := perDevice[i].Load(); n > 5 {
					t.Fatalf("device %d admitted %d, want at most 5", i, n)
				}
			}
		})
	}
}

// TestLimiterGroupRequestReused: a decision's request, pooled, carries
// nothing into the next: a message too large for a group in shadow mode,
// then an ordinary one under enforced quotas, admitted.
func TestLimiterGroupRequestReused(t *testing.T) {
	srv := redistest.Start(t)
	l, _ := newLimiter(t, srv, 20, PolicyFailClosed, time.Second)
	q := devicelimit.Quota{Limit: 100, Window: time.Hour}
	small := devicelimit.WithWindows(devicelimit.PolicyDrop, devicelimit.Limit{Unit: devicelimit.Bytes, N: 10, Window: time.Hour})
	shadow := small
	shadow.Shadow = true
	key := devicelimit.GroupKey("acme")
	for i := range 20 {
		if d := l.AllowGroupAt("dev-1", "", q, key, shadow, 50, 0); d.Allowed || !d.Group || !d.TooLarge {
			t.Fatalf("round %d: 50 bytes against a shadow group of 10: %+v", i, d)
		}
		if d := l.AllowGroupAt("dev-1", "", q, key, small, 5, 0); d.TooLarge || i == 0 && !d.Allowed {
			t.Fatalf("round %d: 5 bytes against a group of 10: %+v", i, d)
		}
	}
}
