package admin

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Snapshot is the gateway's counters and gauges at one instant. Counters
// count since the process started.
type Snapshot struct {
	Allowed, Dropped, Disconnected, Deferred, Overflowed uint64 // publishes by decision
	WouldRefuse                                          uint64 // let through by quotas in shadow mode that would refuse them
	Blocks                                               uint64 // automatic blocks made
	Blocked                                              int    // devices blocked now
	Released, Expired                                    uint64 // deferred messages released / expired
	QueueMessages, QueueBytes                            int64  // deferred queue depth
	DeferredDamaged                                      int64  // deferred messages set aside as damaged
	DevicesTracked                                       int    // windows in the table
	ConnectedClients                                     int64
	Subscriptions                                        int64   // held by the broker, of connected clients and kept sessions
	SnapshotSeconds                                      float64 // duration of the last window snapshot
	SnapshotBytes                                        int64   // size of the last window snapshot
	Snapshots                                            uint64  // window snapshots written
	// LeaseWrites counts the lease writes committed (group commits
	// that held leases) and LeaseRecords the leases they wrote;
	// LeaseWaits the admissions that waited for a lease write.
	LeaseWrites, LeaseRecords, LeaseWaits uint64
	ClockRollbacks                        uint64
	// ACLPublishDenied and ACLSubscribeDenied count what the topic ACL
	// refused.
	ACLPublishDenied, ACLSubscribeDenied uint64
	// ConnectsRefused counts refused connections by reason.
	ConnectsRefused map[string]uint64
	// Refusals counts the publishes the windows refused, by topic class
	// ("" for the device's own quota) and by what refused them, indexed
	// like RefusalKinds.
	Refusals map[string][3]uint64
	// Groups counts, by configured group (its name, or the template
	// that makes its groups), the messages of its devices the group's
	// windows admitted, refused and would refuse in shadow mode,
	// indexed like GroupOutcomes.
	Groups map[string][3]uint64
	// PersistFailing reports that the data file's writes are failing;
	// PersistFailures counts the failed writes.
	PersistFailing  bool
	PersistFailures uint64
	// SlowSubscriberDrops counts messages not delivered to subscribers
	// that had their maximum of messages in flight or of writes queued.
	SlowSubscriberDrops uint64
	// ProtocolErrors counts connections ended after CONNECT for a
	// packet the MQTT specification forbids.
	ProtocolErrors uint64
	// ConsumerWaits counts the publishes that waited for a backend
	// consumer's writer; ConsumerSpoolBytes is what the consumers'
	// write spools hold (mqtt.consumers).
	ConsumerWaits      uint64
	ConsumerSpoolBytes int64
	// ConsumersSpooled counts the connections given a write spool as
	// a backend consumer's.
	ConsumersSpooled uint64
	// Forward is each upstream's forwarding state (docs/forwarding.md,
	// "MQTT upstream").
	Forward []ForwardStats
	// WouldRefuseByRule splits WouldRefuse by the rule the device
	// matched ("" for the default quota).
	WouldRefuseByRule map[string]uint64
}

// ForwardStats is one upstream's forwarding state.
// (forward.Stats, field for field).
type ForwardStats struct {
	Upstream string
	// Connections counts the upstream's connections, Connected those up.
	Connections, Connected int
	LastError              string        // why a connection is down
	RetryIn                time.Duration // until a waiting connection's next attempt
	Forwarded              uint64        // acknowledged by the upstream since start
	Backlog                int64         // messages in the forward logs
	BacklogBytes           int64
	OldestAge              time.Duration // of the oldest message waiting
	// DroppedOldest, Refused and Expired count the messages that never
	// went: dropped for room, refused when full, too old (max_age).
	DroppedOldest, Refused, Expired uint64
	// LowSpace counts those of DroppedOldest and Refused that went
	// because the data file's disk was at its free-space floor.
	LowSpace uint64
	// DeadLetters is how many messages the dead-letter logs hold;
	// DeadByReason counts those moved there since start, by reason;
	// DeadDropped those dropped from a full dead-letter log.
	DeadLetters  int
	DeadByReason map[string]uint64
	DeadDropped  uint64
	// Reordered counts the messages the upstream stored ahead of an
	// earlier one of their connection that had failed.
	Reordered uint64
}

// StatsSource reports the gateway's counters; main adapts the broker's,
// the store's and the table's.
type StatsSource interface {
	MetricsSnapshot() Snapshot
}

var (
	descPublishes        = prometheus.NewDesc("devicegate_publishes_total", "Device publishes by throttle decision.", []string{"decision"}, nil)
	descWouldRefuse      = prometheus.NewDesc("devicegate_publishes_would_refuse_total", "Device publishes a quota in shadow mode (enforce: false) let through that it would have refused; they are counted as allowed too.", nil, nil)
	descBlocks           = prometheus.NewDesc("devicegate_blocks_total", "Devices blocked by automatic blocking (a quota's block: too many refusals within its span).", nil, nil)
	descBlocked          = prometheus.NewDesc("devicegate_devices_blocked", "Devices blocked now; their CONNECTs are refused until their blocks end or are lifted.", nil, nil)
	descReleased         = prometheus.NewDesc("devicegate_deferred_released_total", "Deferred messages released to subscribers.", nil, nil)
	descExpired          = prometheus.NewDesc("devicegate_deferred_expired_total", "Deferred messages discarded after their maximum age.", nil, nil)
	descQueueMessages    = prometheus.NewDesc("devicegate_deferred_queue_messages", "Messages in the deferral queue.", nil, nil)
	descQueueBytes       = prometheus.NewDesc("devicegate_deferred_queue_bytes", "Bytes in the deferral queue.", nil, nil)
	descTracked          = prometheus.NewDesc("devicegate_devices_tracked", "Live rate windows: one per device with one window, more for a device with several windows or topic classes.", nil, nil)
	descConnected        = prometheus.NewDesc("devicegate_connected_clients", "Connected MQTT clients.", nil, nil)
	descSubscriptions    = prometheus.NewDesc("devicegate_subscriptions", "Subscriptions held by the broker (of connected clients and kept sessions).", nil, nil)
	descSnapSeconds      = prometheus.NewDesc("devicegate_snapshot_duration_seconds", "Duration of the last window snapshot.", nil, nil)
	descSnapBytes        = prometheus.NewDesc("devicegate_snapshot_bytes", "Size of the last window snapshot.", nil, nil)
	descSnapshots        = prometheus.NewDesc("devicegate_snapshots_total", "Window snapshots written.", nil, nil)
	descLeaseWrites      = prometheus.NewDesc("devicegate_lease_writes_total", "Lease writes committed to the data file (persist.after_crash: charge), each one transaction for every lease asked since the last.", nil, nil)
	descLeaseRecords     = prometheus.NewDesc("devicegate_lease_records_total", "Window leases written to the data file.", nil, nil)
	descLeaseWaits       = prometheus.NewDesc("devicegate_lease_waits_total", "Admitted publishes that waited for their lease to be written before they were acknowledged.", nil, nil)
	descRollbacks        = prometheus.NewDesc("devicegate_clock_rollbacks_total", "Wall-clock rollbacks detected.", nil, nil)
	descACLDenied        = prometheus.NewDesc("devicegate_acl_denied_total", "Publishes and subscriptions (or deliveries) refused by the topic ACL.", []string{"action"}, nil)
	descRefused          = prometheus.NewDesc("devicegate_connects_refused_total", "Connections refused, by reason.", []string{"reason"}, nil)
	descGroup            = prometheus.NewDesc("devicegate_group_publishes_total", "Publishes of a group's devices by what the group's windows did: admitted, refused, or would_refuse (shadow mode, let through); by configured group: its name, or the template that makes its groups (\"{tenant}\"), so the label's values are bounded by the configuration.", []string{"group", "outcome"}, nil)
	descWindowRefused    = prometheus.NewDesc("devicegate_window_refusals_total", "Publishes the windows refused (policies drop and disconnect), by topic class (\"\" for the device's own quota, \"(override)\" for a class only overrides name) and by what refused them: a message window, a byte window, or a payload larger than a byte window (too_large).", []string{"class", "window"}, nil)
	descPersistFail      = prometheus.NewDesc("devicegate_persist_failing", "1 while writes to the data file fail (snapshots, deferred messages, overrides), else 0.", nil, nil)
	descSlowDrops        = prometheus.NewDesc("devicegate_slow_subscriber_drops_total", "Messages not delivered to a subscriber that does not keep up: it already had its maximum in flight (unacknowledged), or of writes queued.", nil, nil)
	descFwdConnected     = prometheus.NewDesc("devicegate_forward_connected", "The upstream's connections that are up.", []string{"upstream"}, nil)
	descFwdDead          = prometheus.NewDesc("devicegate_forward_dead_letters_total", "Messages the upstream refused for good, moved to its dead-letter log, by reason.", []string{"upstream", "reason"}, nil)
	descFwdReordered     = prometheus.NewDesc("devicegate_forward_reordered_total", "Messages the upstream acknowledged after an earlier message of their connection had failed: stored ahead of it, which is sent again after them (docs/forwarding-failures.md, Order).", []string{"upstream"}, nil)
	descFwdDeadHeld      = prometheus.NewDesc("devicegate_forward_dead_letters", "Messages in the upstream's dead-letter logs.", []string{"upstream"}, nil)
	descFwdOldest        = prometheus.NewDesc("devicegate_forward_oldest_age_seconds", "How long the oldest message in the upstream's forward logs has waited; 0 when none waits.", []string{"upstream"}, nil)
	descFwdForwarded     = prometheus.NewDesc("devicegate_forward_forwarded_total", "Messages the upstream acknowledged.", []string{"upstream"}, nil)
	descFwdBacklog       = prometheus.NewDesc("devicegate_forward_backlog_messages", "Messages in the upstream's forward log, not yet acknowledged upstream.", []string{"upstream"}, nil)
	descFwdBytes         = prometheus.NewDesc("devicegate_forward_backlog_bytes", "Record bytes of the messages in the upstream's forward log.", []string{"upstream"}, nil)
	descFwdDropped       = prometheus.NewDesc("devicegate_forward_dropped_total", "Messages that never went upstream: the oldest dropped for a full log (oldest), new ones refused by a full log (refused), too old when their turn came, or past their MQTT 5 message expiry (expired), the oldest dead letters dropped for a full dead-letter log (dead_letters_full).", []string{"upstream", "reason"}, nil)
	descProtoErrors      = prometheus.NewDesc("devicegate_protocol_errors_total", "Connections ended after CONNECT for a packet the MQTT specification forbids (MQTT 5: DISCONNECT 0x82).", nil, nil)
	descConsumerWaits    = prometheus.NewDesc("devicegate_consumer_waits_total", "Publishes that waited for a backend consumer (mqtt.consumers) whose write queue was more than half full to catch up.", nil, nil)
	descConsumerSpool    = prometheus.NewDesc("devicegate_consumer_spool_bytes", "Bytes written for the connected backend consumers (mqtt.consumers) and not yet sent to their sockets.", nil, nil)
	descConsumersSpooled = prometheus.NewDesc("devicegate_consumers_spooled_total", "Connections of backend consumers (mqtt.consumers, matched at CONNECT) given a write spool.", nil, nil)
	descPersistErrs      = prometheus.NewDesc("devicegate_persist_write_failures_total", "Failed writes to the data file.", nil, nil)
	descDeferDamaged     = prometheus.NewDesc("devicegate_deferred_damaged", "Deferred messages set aside in the data file as damaged (checksum mismatch, or a record that does not decode), never released.", nil, nil)
	descFwdLowSpace      = prometheus.NewDesc("devicegate_forward_low_space_total", "Messages refused (overflow refuse_new) or the oldest dropped (drop_oldest) because the data file's disk was at its free-space floor (persist.min_free_bytes); counted in devicegate_forward_dropped_total too.", []string{"upstream"}, nil)
)

// collector reads a StatsSource at each scrape, so the domain types
// know nothing of Prometheus.
type collector struct{ src StatsSource }

// NewCollector returns a collector of src's counters. Register it on a
// private registry (with the Go and process collectors); the metrics have
// no per-device labels.
func NewCollector(src StatsSource) prometheus.Collector { return collector{src} }

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPublishes, descWouldRefuse, descBlocks, descBlocked, descReleased, descExpired, descQueueMessages, descQueueBytes, descDeferDamaged,
		descTracked, descConnected, descSubscriptions, descSnapSeconds, descSnapBytes, descSnapshots, descLeaseWrites, descLeaseRecords, descLeaseWaits, descRollbacks,
		descACLDenied, descRefused, descPersistFail, descPersistErrs, descSlowDrops, descProtoErrors, descFwdConnected, descFwdForwarded, descFwdBacklog, descFwdBytes, descFwdDropped, descFwdLowSpace, descFwdOldest, descFwdDead, descFwdDeadHeld, descFwdReordered, descWindowRefused, descGroup, descConsumerWaits, descConsumerSpool, descConsumersSpooled} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.MetricsSnapshot()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter(descPublishes, s.Allowed, "allowed")
	counter(descPublishes, s.Dropped, "dropped")
	counter(descPublishes, s.Deferred, "deferred")
	counter(descPublishes, s.Overflowed, "overflowed")
	counter(descPublishes, s.Disconnected, "disconnected")
	counter(descWouldRefuse, s.WouldRefuse)
	counter(descBlocks, s.Blocks)
	gauge(descBlocked, float64(s.Blocked))
	counter(descReleased, s.Released)
	counter(descExpired, s.Expired)
	gauge(descQueueMessages, float64(s.QueueMessages))
	gauge(descQueueBytes, float64(s.QueueBytes))
	gauge(descDeferDamaged, float64(s.DeferredDamaged))
	gauge(descTracked, float64(s.DevicesTracked))
	gauge(descConnected, float64(s.ConnectedClients))
	gauge(descSubscriptions, float64(s.Subscriptions))
	gauge(descSnapSeconds, s.SnapshotSeconds)
	gauge(descSnapBytes, float64(s.SnapshotBytes))
	counter(descSnapshots, s.Snapshots)
	counter(descLeaseWrites, s.LeaseWrites)
	counter(descLeaseRecords, s.LeaseRecords)
	counter(descLeaseWaits, s.LeaseWaits)
	counter(descRollbacks, s.ClockRollbacks)
	counter(descACLDenied, s.ACLPublishDenied, "publish")
	counter(descACLDenied, s.ACLSubscribeDenied, "subscribe")
	failing := 0.0
	if s.PersistFailing {
		failing = 1
	}
	gauge(descPersistFail, failing)
	counter(descPersistErrs, s.PersistFailures)
	counter(descSlowDrops, s.SlowSubscriberDrops)
	counter(descProtoErrors, s.ProtocolErrors)
	counter(descConsumerWaits, s.ConsumerWaits)
	gauge(descConsumerSpool, float64(s.ConsumerSpoolBytes))
	counter(descConsumersSpooled, s.ConsumersSpooled)
	for _, f := range s.Forward {
		ch <- prometheus.MustNewConstMetric(descFwdConnected, prometheus.GaugeValue, float64(f.Connected), f.Upstream)
		ch <- prometheus.MustNewConstMetric(descFwdOldest, prometheus.GaugeValue, f.OldestAge.Seconds(), f.Upstream)
		counter(descFwdForwarded, f.Forwarded, f.Upstream)
		ch <- prometheus.MustNewConstMetric(descFwdBacklog, prometheus.GaugeValue, float64(f.Backlog), f.Upstream)
		ch <- prometheus.MustNewConstMetric(descFwdBytes, prometheus.GaugeValue, float64(f.BacklogBytes), f.Upstream)
		counter(descFwdDropped, f.DroppedOldest, f.Upstream, "oldest")
		counter(descFwdDropped, f.Refused, f.Upstream, "refused")
		counter(descFwdDropped, f.Expired, f.Upstream, "expired")
		counter(descFwdDropped, f.DeadDropped, f.Upstream, "dead_letters_full")
		counter(descFwdLowSpace, f.LowSpace, f.Upstream)
		counter(descFwdReordered, f.Reordered, f.Upstream)
		for reason, n := range f.DeadByReason {
			counter(descFwdDead, n, f.Upstream, reason)
		}
		ch <- prometheus.MustNewConstMetric(descFwdDeadHeld, prometheus.GaugeValue, float64(f.DeadLetters), f.Upstream)
	}
	for reason, n := range s.ConnectsRefused {
		counter(descRefused, n, reason)
	}
	for class, ns := range s.Refusals {
		for k, n := range ns {
			counter(descWindowRefused, n, class, RefusalKinds[k])
		}
	}
	for group, ns := range s.Groups {
		for k, n := range ns {
			counter(descGroup, n, group, GroupOutcomes[k])
		}
	}
}

// GroupOutcomes are the outcome label values of
// devicegate_group_publishes_total, by Snapshot.Groups' index.
var GroupOutcomes = [3]string{"admitted", "refused", "would_refuse"}

// RefusalKinds are the window label values of
// devicegate_window_refusals_total, by Snapshot.Refusals' index.
var RefusalKinds = [3]string{"messages", "bytes", "too_large"}
