package server

// What the admin API reads of the running gateway: adapters from the
// broker, the throttled-device tracker and the counters to the admin
// package's interfaces.

import (
	"fmt"
	"strings"
	"time"

	"github.com/devicegate/devicegate/admin"
	"github.com/devicegate/devicegate/broker"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/forward"
	"github.com/devicegate/devicegate/internal/topk"
	"github.com/devicegate/devicegate/persist"
)

// brokerDevices reports the broker's view of a device to the admin API.
type brokerDevices struct{ srv *broker.Server }

func (d brokerDevices) Status(device string) admin.DeviceStatus {
	return admin.DeviceStatus(d.srv.DeviceStatus(device))
}

// Deferred lists the first n of a device's deferred messages.
func (d brokerDevices) Deferred(device string, n int) ([]admin.DeferredMessage, int) {
	list, total := d.srv.Deferred(device, n)
	out := make([]admin.DeferredMessage, len(list))
	for i, m := range list {
		out[i] = admin.DeferredMessage(m)
	}
	return out, total
}

// brokerGroups lists the groups of the devices connected.
type brokerGroups struct{ srv *broker.Server }

func (g brokerGroups) Groups() []admin.GroupMembers {
	var out []admin.GroupMembers
	for _, x := range g.srv.Groups() {
		out = append(out, admin.GroupMembers(x))
	}
	return out
}

// brokerBlocks lists and lifts the broker's automatic blocks.
type brokerBlocks struct {
	srv *broker.Server
	// snap writes the table's changes now: an unblock forgets the
	// refusals that led to the block, and a crash after it is
	// acknowledged must not bring them back (the block itself is
	// deleted from the data file before Unblock returns).
	snap interface {
		Snapshot() (persist.SnapshotStats, error)
	}
}

func (b brokerBlocks) Blocked() []admin.BlockedDevice {
	var out []admin.BlockedDevice
	for _, x := range b.srv.Blocks() {
		out = append(out, admin.BlockedDevice(x))
	}
	return out
}

func (b brokerBlocks) Block(device string) (admin.BlockedDevice, bool) {
	x, ok := b.srv.Block(device)
	return admin.BlockedDevice(x), ok
}

func (b brokerBlocks) Unblock(device string) (bool, error) {
	had, err := b.srv.Unblock(device)
	if had && err == nil && b.snap != nil {
		if _, err = b.snap.Snapshot(); err != nil {
			err = fmt.Errorf("write the forgotten refusals of %q: %w", device, err)
		}
	}
	return had, err
}

// trackedDevices lists the devices the broker tracks and those holding
// a window in the table (restored from the data file, say) that it does
// not.
type trackedDevices struct {
	srv   *broker.Server
	table *devicelimit.Table
}

func (t trackedDevices) List() []admin.DeviceSummary {
	bs := t.srv.Devices()
	out := make([]admin.DeviceSummary, len(bs), max(len(bs), t.table.Len()))
	known := make(map[string]struct{}, len(bs))
	for i, d := range bs {
		out[i] = admin.DeviceSummary{Device: d.Device, Status: admin.DeviceStatus(d.DeviceStatus), Refusals: d.Refusals, LastRefused: d.LastRefused,
			Recent: d.Recent, Use: d.Use}
		known[d.Device] = struct{}{}
	}
	t.table.Devices(func(device string) {
		if _, ok := known[device]; !ok {
			out = append(out, admin.DeviceSummary{Device: strings.Clone(device)})
		}
	})
	return out
}

func (t trackedDevices) Refusals(device string) []admin.Refusal {
	var out []admin.Refusal
	for _, r := range t.srv.Refusals(device) {
		out = append(out, admin.Refusal(r))
	}
	return out
}

// History returns a device's outcomes by minute and by hour.
func (d brokerDevices) History(device string) (admin.DeviceHistory, bool) {
	spans, ok := d.srv.History(device)
	var out admin.DeviceHistory
	for i, sp := range spans {
		out[i] = admin.HistorySpan(sp)
	}
	return out, ok
}

// Next judges a device's next message as the broker would.
func (d brokerDevices) Next(device string, peek func(string, string, []devicelimit.Limit, int, devicelimit.Tick) (devicelimit.Verdict, error)) ([]admin.NextMessage, error) {
	list, err := d.srv.NextMessages(device, peek)
	out := make([]admin.NextMessage, len(list))
	for i, n := range list {
		out[i] = admin.NextMessage(n)
	}
	return out, err
}

// topThrottled lists the devices refused most, as of now.
type topThrottled struct {
	topk  *topk.Tracker
	clock devicelimit.Clock
}

func (t topThrottled) Top(n int) []admin.ThrottledDevice {
	top := t.topk.Top(n, t.clock.Now())
	out := make([]admin.ThrottledDevice, len(top))
	for i, e := range top {
		out[i] = admin.ThrottledDevice(e)
	}
	return out
}

// statsSource gathers the metrics from the broker, the table and the
// snapshotter.
// health reports whether the gateway can still write its data file, for
// /healthz.
func (g *Gateway) health() error {
	h := g.store.Health()
	if !h.Failing {
		return nil
	}
	return fmt.Errorf("data file %s: writes failing since %s (%d failed writes): %s",
		g.store.Path(), h.Since.UTC().Format(time.RFC3339), h.Failures, h.Err)
}

type statsSource struct {
	forward   *forward.Set // nil without upstreams
	store     *persist.Store
	srv       *broker.Server
	table     *devicelimit.Table
	snap      *persist.Snapshotter
	leaser    *persist.Leaser // nil without leases
	rollbacks uint64          // 1 when the clock started behind the high-water
}

func (s statsSource) MetricsSnapshot() admin.Snapshot {
	st := s.srv.Stats()
	as := s.srv.AuthStats()
	last, written := s.snap.Stats()
	var leaseWrites, leaseRecords uint64
	if s.leaser != nil {
		leaseWrites, leaseRecords = s.leaser.Stats()
	}
	ph := s.store.Health()
	return admin.Snapshot{
		Allowed:          st.Allowed,
		Dropped:          st.Dropped,
		Disconnected:     st.Disconnected,
		WouldRefuse:      st.WouldRefuse,
		Blocks:           st.Blocks,
		Blocked:          st.Blocked,
		Deferred:         st.Deferred,
		Overflowed:       st.Overflowed,
		Released:         st.Released,
		Expired:          st.Expired,
		QueueMessages:    st.QueueMessages,
		QueueBytes:       st.QueueBytes,
		DeferredDamaged:  st.DeferredDamaged,
		DevicesTracked:   s.table.Len(),
		ConnectedClients: st.ConnectedClients,
		Subscriptions:    st.Subscriptions,
		ClockRollbacks:   s.rollbacks,
		SnapshotSeconds:  last.Took.Seconds(),
		SnapshotBytes:    int64(last.Bytes),
		Snapshots:        written,
		LeaseWrites:      leaseWrites,
		LeaseRecords:     leaseRecords,
		LeaseWaits:       s.table.LeaseWaits(),

		ACLPublishDenied:    as.PublishDenied,
		ACLSubscribeDenied:  as.SubscribeDenied,
		ConnectsRefused:     as.ConnectsRefused,
		Refusals:            st.Refusals,
		Groups:              st.Groups,
		PersistFailing:      ph.Failing,
		PersistFailures:     ph.Failures,
		SlowSubscriberDrops: st.SlowSubscriberDrops,
		ProtocolErrors:      as.ProtocolErrors,
		ConsumerWaits:       as.ConsumerWaits,
		ConsumerSpoolBytes:  as.ConsumerSpoolBytes,
		ConsumersSpooled:    as.ConsumersSpooled,
		Forward:             forwardStats(s.forward),

		WouldRefuseByRule: st.WouldRefuseByRule,
	}
}
