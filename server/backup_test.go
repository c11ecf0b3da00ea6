package server

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/devicegate/devicegate/admin"
	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/freeport"
	"github.com/devicegate/devicegate/internal/mqtttest"
	"github.com/devicegate/devicegate/internal/poll"
	"github.com/devicegate/devicegate/persist"
)

// TestBackupUnderLoad: 50 devices publish while GET /api/v1/backup
// copies the data file: 25 within a large quota (their windows and the
// forward log grow), 25 over a small one with policy defer (their
// queues grow), the upstream down so that the forward log keeps every
// admitted message. Overrides and blocks are set before. A second
// gateway started on the copy has the overrides and blocks, and every
// device's window, deferred queue and the forward log hold at least
// what was acknowledged before the backup began and at most what was
// sent before it ended.
func TestBackupUnderLoad(t *testing.T) {
	dead, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	build := func(dir string) config.Config {
		cfg := testConfig(dir, 100000, time.Hour)
		cfg.Admin.Token = "test-token"
		cfg.Limits.Rules = []config.Rule{
			{Name: "deferred", Match: config.Match{ClientID: "dfr-*"}, Quota: config.Quota{Limit: 10, Window: config.Duration(time.Hour), Policy: devicelimit.PolicyDefer}},
			{Name: "blocked", Match: config.Match{ClientID: "blk-*"}, Quota: config.Quota{Limit: 1, Window: config.Duration(time.Hour),
				Block: &config.Block{After: 1, Within: config.Duration(time.Hour), For: config.Duration(time.Hour)}}},
		}
		cfg.Forward = []config.Forward{{Name: "cloud", To: "mqtt://" + dead, Topics: []string{"devices/#"}, MaxQoS: 1}}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	g := mustStart(t, build(t.TempDir()), Deps{})
	api := &admin.Client{Addr: g.AdminAddr().String(), Token: "test-token", HTTP: &http.Client{Timeout: 10 * time.Second}}
	ctx := context.Background()
	for i := range 3 {
		if err := g.SetOverride(fmt.Sprintf("ovr-%d", i), devicelimit.Override{Quota: devicelimit.Quota{Limit: 7 + i, Window: time.Hour, Policy: devicelimit.PolicyDrop}}); err != nil {
			t.Fatal(err)
		}
		blk := mqtttest.Dial5(t, g.Addr().String(), fmt.Sprintf("blk-%d", i))
		blk.MustPublish(t, "devices/blk/t", "m", mqtttest.CodeSuccess)
		_, _, _ = blk.PublishReason("devices/blk/t", "m") // refused: blocked
		blk.Close()
	}
	poll.Until(t, 10*time.Second, "3 blocks", func() bool { v, _, err := api.Blocks(ctx); return err == nil && len(v.Blocks) == 3 })

	type device struct {
		id         string
		sent, done atomic.Int64 // publishes begun; acknowledged
	}
	var devs []*device
	for i := range 25 {
		devs = append(devs, &device{id: fmt.Sprintf("win-%d", i)}, &device{id: fmt.Sprintf("dfr-%d", i)})
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, d := range devs {
		c := mqtttest.Dial5(t, g.Addr().String(), d.id)
		wg.Go(func() {
			defer c.Close()
			for {
				select {
				case <-stop:
					return
				default:
				}
				d.sent.Add(1)
				if _, err := c.Publish("devices/"+d.id+"/t", "payload"); err != nil {
					t.Errorf("%s: %v", d.id, err)
					return
				}
				d.done.Add(1)
			}
		})
	}
	// Every deferring device past its quota before the copy.
	poll.Until(t, 20*time.Second, "every device deferring", func() bool {
		for _, d := range devs {
			if d.done.Load() < 12 {
				return false
			}
		}
		return true
	})
	before := make([]int64, len(devs))
	for i, d := range devs {
		before[i] = d.done.Load()
	}
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, persist.FileName))
	if err != nil {
		t.Fatal(err)
	}
	n, err := api.Backup(ctx, f)
	if err != nil {
		t.Fatalf("backup: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	after := make([]int64, len(devs))
	for i, d := range devs {
		after[i] = d.sent.Load()
	}
	close(stop)
	wg.Wait()
	t.Logf("backup of %d bytes; publishes during it: %d", n, sum(after)-sum(before))
	if sum(after)-sum(before) < int64(len(devs)) {
		t.Errorf("only %d publishes while the backup ran: not under load", sum(after)-sum(before))
	}

	g2 := mustStart(t, build(dir), Deps{})
	api2 := &admin.Client{Addr: g2.AdminAddr().String(), Token: "test-token", HTTP: api.HTTP}
	if g2.prevUnclean {
		t.Errorf("the copy is not marked clean")
	}
	var fwdLo, fwdHi int64
	for i, d := range devs {
		v, _, err := api2.Device(ctx, d.id)
		if err != nil {
			t.Fatal(err)
		}
		got, lo, hi := int64(v.Used), before[i], after[i]
		if d.id[:3] == "dfr" {
			got, lo, hi = int64(v.Deferred), before[i]-10, after[i]-10
			if v.Used != 10 {
				t.Errorf("%s: window holds %d in the copy, want 10", d.id, v.Used)
			}
			fwdLo, fwdHi = fwdLo+10, fwdHi+10
		} else {
			fwdLo, fwdHi = fwdLo+lo, fwdHi+hi
		}
		if got < lo || got > hi {
			t.Errorf("%s in the copy: %d, want between %d (acknowledged before the backup) and %d (sent before its end)", d.id, got, lo, hi)
		}
	}
	msgs, _, _, _, err := g2.store.ForwardStats("cloud/0")
	if err != nil {
		t.Fatal(err)
	}
	if int64(msgs) < fwdLo || int64(msgs) > fwdHi {
		t.Errorf("forward log of the copy: %d messages, want between %d and %d", msgs, fwdLo, fwdHi)
	}
	q1, _, err := api.Quotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	q2, _, err := api2.Quotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(q1) != fmt.Sprint(q2) || len(q2.Overrides) != 3 {
		t.Errorf("overrides: copy %+v, original %+v", q2, q1)
	}
	b1, _, _ := api.Blocks(ctx)
	b2, _, err := api2.Blocks(ctx)
	if err != nil || fmt.Sprint(b1) != fmt.Sprint(b2) || len(b2.Blocks) != 3 {
		t.Errorf("blocks: copy %+v (%v), original %+v", b2, err, b1)
	}
	t.Logf("copy: forward log %d messages (bounds %d..%d), %d overrides, %d blocks", msgs, fwdLo, fwdHi, len(q2.Overrides), len(b2.Blocks))
}

func sum(xs []int64) (s int64) {
	for _, x := range xs {
		s += x
	}
	return s
}
