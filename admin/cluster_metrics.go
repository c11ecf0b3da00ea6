package admin

import "github.com/prometheus/client_golang/prometheus"

// ClusterStats is what the shared-window limiter has done: its failure
// policy, the decisions that policy took, and whether Redis answers.
type ClusterStats struct {
	Policy    string
	Fallbacks uint64
	Up        bool
	// Owner holds owner mode's counters (cluster.decisions: owner); nil
	// otherwise.
	Owner *OwnerStats
}

// OwnerStats are owner mode's counters (cluster.OwnerStats).
type OwnerStats struct {
	Claims, ClaimWaits, Charges, Checkpoints, Fenced, Releases, Fallbacks uint64
	Owned                                                                 int
	// Group grants: claims sent, refused by Redis, failed or not sent;
	// units granted and given back, by unit (messages, bytes); the groups
	// held now.
	GrantClaims, GrantRefused, GrantFailed uint64
	GrantUnits, GrantReturned              [2]uint64
	Grants                                 int
}

// ClusterSource reports the shared-window limiter's counters.
type ClusterSource interface {
	ClusterStats() ClusterStats
}

var (
	descClusterFallbacks = prometheus.NewDesc("devicegate_cluster_fallbacks_total",
		"Decisions taken by the failure policy because Redis was unreachable or slower than the timeout.", []string{"policy"}, nil)
	descClusterUp = prometheus.NewDesc("devicegate_cluster_redis_up",
		"1 while Redis answers the shared-window decisions, 0 from a failed decision until one succeeds.", nil, nil)
)

// Owner mode's metrics, each a counter but the owned devices.
var ownerDescs = [...]struct {
	desc *prometheus.Desc
	get  func(OwnerStats) float64
}{
	{prometheus.NewDesc("devicegate_cluster_owner_claims_total", "Devices this gateway claimed (owner mode), at their connection or first decision.", nil, nil),
		func(s OwnerStats) float64 { return float64(s.Claims) }},
	{prometheus.NewDesc("devicegate_cluster_owner_claim_waits_total", "Claims that waited for a live previous owner to release the device.", nil, nil),
		func(s OwnerStats) float64 { return float64(s.ClaimWaits) }},
	{prometheus.NewDesc("devicegate_cluster_owner_charges_total", "Windows charged, at a claim, the lease their previous owner could not account for (it crashed or was cut off).", nil, nil),
		func(s OwnerStats) float64 { return float64(s.Charges) }},
	{prometheus.NewDesc("devicegate_cluster_owner_checkpoints_total", "Device checkpoints written to Redis.", nil, nil),
		func(s OwnerStats) float64 { return float64(s.Checkpoints) }},
	{prometheus.NewDesc("devicegate_cluster_owner_fenced_total", "Checkpoints refused because another gateway owned the device meanwhile: the device was dropped here.", nil, nil),
		func(s OwnerStats) float64 { return float64(s.Fenced) }},
	{prometheus.NewDesc("devicegate_cluster_owner_releases_total", "Devices released to another gateway, or at shutdown.", nil, nil),
		func(s OwnerStats) float64 { return float64(s.Releases) }},
	{prometheus.NewDesc("devicegate_cluster_owner_fallbacks_total", "Decisions taken by the failure policy because this gateway could not use its lease on the device.", nil, nil),
		func(s OwnerStats) float64 { return float64(s.Fallbacks) }},
	{prometheus.NewDesc("devicegate_cluster_group_grant_claims_total", "Group grant claims this gateway sent to Redis (owner mode), one script call each.", nil, nil),
		func(s OwnerStats) float64 { return float64(s.GrantClaims) }},
	{prometheus.NewDesc("devicegate_cluster_group_grant_refused_total", "Group grant claims Redis refused: a window of the group had no room for the message.", nil, nil),
		func(s OwnerStats) float64 { return float64(s.GrantRefused) }},
	{prometheus.NewDesc("devicegate_cluster_group_grant_failed_total", "Group grant claims that failed or were not sent because Redis was away: the decision took the failure policy.", nil, nil),
		func(s OwnerStats) float64 { return float64(s.GrantFailed) }},
	{prometheus.NewDesc("devicegate_cluster_owned_devices", "Devices in this gateway's owner table (owner mode): those it decides for, being claimed or just lost.", nil, nil),
		func(s OwnerStats) float64 { return float64(s.Owned) }},
	{prometheus.NewDesc("devicegate_cluster_group_grants", "Groups this gateway holds grant state for (owner mode).", nil, nil),
		func(s OwnerStats) float64 { return float64(s.Grants) }},
}

// ownerGauges is the number of ownerDescs' last entries that are gauges.
const ownerGauges = 2

// Group grant units by unit (owner mode): granted, given back.
var (
	descGrantUnits = prometheus.NewDesc("devicegate_cluster_group_grant_units_total",
		"Units of group windows this gateway's grant claims were granted (owner mode), by unit.", []string{"unit"}, nil)
	descGrantReturned = prometheus.NewDesc("devicegate_cluster_group_grant_returned_units_total",
		"Unused units of group grants this gateway gave back to Redis (owner mode), by unit.", []string{"unit"}, nil)
	unitNames = [2]string{"messages", "bytes"}
)

type clusterCollector struct{ src ClusterSource }

// NewClusterCollector returns a collector of the shared-window
// limiter's metrics; register it beside NewCollector's when the gateway
// shares its windows in Redis.
func NewClusterCollector(src ClusterSource) prometheus.Collector { return clusterCollector{src} }

func (clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descClusterFallbacks
	ch <- descClusterUp
	for _, d := range ownerDescs {
		ch <- d.desc
	}
	ch <- descGrantUnits
	ch <- descGrantReturned
}

func (c clusterCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.ClusterStats()
	up := 0.0
	if s.Up {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(descClusterFallbacks, prometheus.CounterValue, float64(s.Fallbacks), s.Policy)
	ch <- prometheus.MustNewConstMetric(descClusterUp, prometheus.GaugeValue, up)
	if s.Owner == nil {
		return
	}
	for i, d := range ownerDescs {
		kind := prometheus.CounterValue
		if i >= len(ownerDescs)-ownerGauges {
			kind = prometheus.GaugeValue
		}
		ch <- prometheus.MustNewConstMetric(d.desc, kind, d.get(*s.Owner))
	}
	for u, name := range unitNames {
		ch <- prometheus.MustNewConstMetric(descGrantUnits, prometheus.CounterValue, float64(s.Owner.GrantUnits[u]), name)
		ch <- prometheus.MustNewConstMetric(descGrantReturned, prometheus.CounterValue, float64(s.Owner.GrantReturned[u]), name)
	}
}
