package admin

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestCollector(t *testing.T) {
	src := fixedStats{Snapshot{
		Allowed: 10, Dropped: 2, Disconnected: 1, WouldRefuse: 31, Blocks: 32, Blocked: 2, Deferred: 3, Overflowed: 4, Released: 5, Expired: 6,
		QueueMessages: 7, QueueBytes: 800, DevicesTracked: 9, ConnectedClients: 11, Subscriptions: 17, PersistFailing: true, PersistFailures: 18, SlowSubscriberDrops: 19, ProtocolErrors: 20, ConsumerWaits: 43, ConsumerSpoolBytes: 44, ConsumersSpooled: 45, DeferredDamaged: 46,
		Forward: []ForwardStats{{Upstream: "cloud", Connections: 2, Connected: 1, Forwarded: 21, Backlog: 22, BacklogBytes: 2300,
			OldestAge: 1500 * time.Millisecond, DroppedOldest: 3, Refused: 4, Expired: 5, LowSpace: 2, DeadLetters: 2, DeadByReason: map[string]uint64{"too_large": 6}, DeadDropped: 1}},
		SnapshotSeconds: 0.25, SnapshotBytes: 4096, Snapshots: 12, LeaseWrites: 5, LeaseRecords: 50, LeaseWaits: 7, ClockRollbacks: 1,
		ACLPublishDenied: 13, ACLSubscribeDenied: 14, ConnectsRefused: map[string]uint64{"credentials": 15, "rate": 16},
		Groups: map[string][3]uint64{"{tenant}": {40, 41, 42}},
	}}
	reg := prometheus.NewRegistry()
	c := NewCollector(src)
	reg.MustRegister(c)
	want := `
# HELP devicegate_acl_denied_total Publishes and subscriptions (or deliveries) refused by the topic ACL.
# TYPE devicegate_acl_denied_total counter
devicegate_acl_denied_total{action="publish"} 13
devicegate_acl_denied_total{action="subscribe"} 14
# HELP devicegate_blocks_total Devices blocked by automatic blocking (a quota's block: too many refusals within its span).
# TYPE devicegate_blocks_total counter
devicegate_blocks_total 32
# HELP devicegate_clock_rollbacks_total Wall-clock rollbacks detected.
# TYPE devicegate_clock_rollbacks_total counter
devicegate_clock_rollbacks_total 1
# HELP devicegate_connected_clients Connected MQTT clients.
# TYPE devicegate_connected_clients gauge
devicegate_connected_clients 11
# HELP devicegate_connects_refused_total Connections refused, by reason.
# TYPE devicegate_connects_refused_total counter
devicegate_connects_refused_total{reason="credentials"} 15
devicegate_connects_refused_total{reason="rate"} 16
# HELP devicegate_consumer_spool_bytes Bytes written for the connected backend consumers (mqtt.consumers) and not yet sent to their sockets.
# TYPE devicegate_consumer_spool_bytes gauge
devicegate_consumer_spool_bytes 44
# HELP devicegate_consumer_waits_total Publishes that waited for a backend consumer (mqtt.consumers) whose write queue was more than half full to catch up.
# TYPE devicegate_consumer_waits_total counter
devicegate_consumer_waits_total 43
# HELP devicegate_consumers_spooled_total Connections of backend consumers (mqtt.consumers, matched at CONNECT) given a write spool.
# TYPE devicegate_consumers_spooled_total counter
devicegate_consumers_spooled_total 45
# HELP devicegate_deferred_damaged Deferred messages set aside in the data file as damaged (checksum mismatch, or a record that does not decode), never released.
# TYPE devicegate_deferred_damaged gauge
devicegate_deferred_damaged 46
# HELP devicegate_deferred_expired_total Deferred messages discarded after their maximum age.
# TYPE devicegate_deferred_expired_total counter
devicegate_deferred_expired_total 6
# HELP devicegate_deferred_queue_bytes Bytes in the deferral queue.
# TYPE devicegate_deferred_queue_bytes gauge
devicegate_deferred_queue_bytes 800
# HELP devicegate_deferred_queue_messages Messages in the deferral queue.
# TYPE devicegate_deferred_queue_messages gauge
devicegate_deferred_queue_messages 7
# HELP devicegate_deferred_released_total Deferred messages released to subscribers.
# TYPE devicegate_deferred_released_total counter
devicegate_deferred_released_total 5
# HELP devicegate_devices_blocked Devices blocked now; their CONNECTs are refused until their blocks end or are lifted.
# TYPE devicegate_devices_blocked gauge
devicegate_devices_blocked 2
# HELP devicegate_devices_tracked Live rate windows: one per device with one window, more for a device with several windows or topic classes.
# TYPE devicegate_devices_tracked gauge
devicegate_devices_tracked 9
# HELP devicegate_group_publishes_total Publishes of a group's devices by what the group's windows did: admitted, refused, or would_refuse (shadow mode, let through); by configured group: its name, or the template that makes its groups ("{tenant}"), so the label's values are bounded by the configuration.
# TYPE devicegate_group_publishes_total counter
devicegate_group_publishes_total{group="{tenant}",outcome="admitted"} 40
devicegate_group_publishes_total{group="{tenant}",outcome="refused"} 41
devicegate_group_publishes_total{group="{tenant}",outcome="would_refuse"} 42
# HELP devicegate_persist_failing 1 while writes to the data file fail (snapshots, deferred messages, overrides), else 0.
# TYPE devicegate_persist_failing gauge
devicegate_persist_failing 1
# HELP devicegate_persist_write_failures_total Failed writes to the data file.
# TYPE devicegate_persist_write_failures_total counter
devicegate_persist_write_failures_total 18
# HELP devicegate_forward_backlog_bytes Record bytes of the messages in the upstream's forward log.
# TYPE devicegate_forward_backlog_bytes gauge
devicegate_forward_backlog_bytes{upstream="cloud"} 2300
# HELP devicegate_forward_backlog_messages Messages in the upstream's forward log, not yet acknowledged upstream.
# TYPE devicegate_forward_backlog_messages gauge
devicegate_forward_backlog_messages{upstream="cloud"} 22
# HELP devicegate_forward_connected The upstream's connections that are up.
# TYPE devicegate_forward_connected gauge
devicegate_forward_connected{upstream="cloud"} 1
# HELP devicegate_forward_dead_letters Messages in the upstream's dead-letter logs.
# TYPE devicegate_forward_dead_letters gauge
devicegate_forward_dead_letters{upstream="cloud"} 2
# HELP devicegate_forward_dead_letters_total Messages the upstream refused for good, moved to its dead-letter log, by reason.
# TYPE devicegate_forward_dead_letters_total counter
devicegate_forward_dead_letters_total{reason="too_large",upstream="cloud"} 6
# HELP devicegate_forward_dropped_total Messages that never went upstream: the oldest dropped for a full log (oldest), new ones refused by a full log (refused), too old when their turn came, or past their MQTT 5 message expiry (expired), the oldest dead letters dropped for a full dead-letter log (dead_letters_full).
# TYPE devicegate_forward_dropped_total counter
devicegate_forward_dropped_total{reason="dead_letters_full",upstream="cloud"} 1
devicegate_forward_dropped_total{reason="expired",upstream="cloud"} 5
devicegate_forward_dropped_total{reason="oldest",upstream="cloud"} 3
devicegate_forward_dropped_total{reason="refused",upstream="cloud"} 4
# HELP devicegate_forward_forwarded_total Messages the upstream acknowledged.
# TYPE devicegate_forward_forwarded_total counter
devicegate_forward_forwarded_total{upstream="cloud"} 21
# HELP devicegate_forward_low_space_total Messages refused (overflow refuse_new) or the oldest dropped (drop_oldest) because the data file's disk was at its free-space floor (persist.min_free_bytes); counted in devicegate_forward_dropped_total too.
# TYPE devicegate_forward_low_space_total counter
devicegate_forward_low_space_total{upstream="cloud"} 2
# HELP devicegate_forward_oldest_age_seconds How long the oldest message in the upstream's forward logs has waited; 0 when none waits.
# TYPE devicegate_forward_oldest_age_seconds gauge
devicegate_forward_oldest_age_seconds{upstream="cloud"} 1.5
# HELP devicegate_forward_reordered_total Messages the upstream acknowledged after an earlier message of their connection had failed: stored ahead of it, which is sent again after them (docs/forwarding-failures.md, Order).
# TYPE devicegate_forward_reordered_total counter
devicegate_forward_reordered_total{upstream="cloud"} 0
# HELP devicegate_lease_records_total Window leases written to the data file.
# TYPE devicegate_lease_records_total counter
devicegate_lease_records_total 50
# HELP devicegate_lease_waits_total Admitted publishes that waited for their lease to be written before they were acknowledged.
# TYPE devicegate_lease_waits_total counter
devicegate_lease_waits_total 7
# HELP devicegate_lease_writes_total Lease writes committed to the data file (persist.after_crash: charge), each one transaction for every lease asked since the last.
# TYPE devicegate_lease_writes_total counter
devicegate_lease_writes_total 5
# HELP devicegate_protocol_errors_total Connections ended after CONNECT for a packet the MQTT specification forbids (MQTT 5: DISCONNECT 0x82).
# TYPE devicegate_protocol_errors_total counter
devicegate_protocol_errors_total 20
# HELP devicegate_publishes_total Device publishes by throttle decision.
# TYPE devicegate_publishes_total counter
devicegate_publishes_total{decision="allowed"} 10
devicegate_publishes_total{decision="deferred"} 3
devicegate_publishes_total{decision="disconnected"} 1
devicegate_publishes_total{decision="dropped"} 2
devicegate_publishes_total{decision="overflowed"} 4
# HELP devicegate_publishes_would_refuse_total Device publishes a quota in shadow mode (enforce: false) let through that it would have refused; they are counted as allowed too.
# TYPE devicegate_publishes_would_refuse_total counter
devicegate_publishes_would_refuse_total 31
# HELP devicegate_slow_subscriber_drops_total Messages not delivered to a subscriber that does not keep up: it already had its maximum in flight (unacknowledged), or of writes queued.
# TYPE devicegate_slow_subscriber_drops_total counter
devicegate_slow_subscriber_drops_total 19
# HELP devicegate_snapshot_bytes Size of the last window snapshot.
# TYPE devicegate_snapshot_bytes gauge
devicegate_snapshot_bytes 4096
# HELP devicegate_snapshot_duration_seconds Duration of the last window snapshot.
# TYPE devicegate_snapshot_duration_seconds gauge
devicegate_snapshot_duration_seconds 0.25
# HELP devicegate_snapshots_total Window snapshots written.
# TYPE devicegate_snapshots_total counter
devicegate_snapshots_total 12
# HELP devicegate_subscriptions Subscriptions held by the broker (of connected clients and kept sessions).
# TYPE devicegate_subscriptions gauge
devicegate_subscriptions 17
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(c); n != 50 {
		t.Fatalf("%d series, want 50", n)
	}
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
	}
}
