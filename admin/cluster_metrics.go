package admin

import "github.com/prometheus/client_golang/prometheus"

// ClusterStats is what the shared-window limiter has done: its failure
// policy, the decisions that policy took, and whether Redis answers.
type ClusterStats struct {
	Policy    string
	Fallbacks uint64
	Up        bool
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

type clusterCollector struct{ src ClusterSource }

// NewClusterCollector returns a collector of the shared-window
// limiter's metrics; register it beside NewCollector's when the gateway
// shares its windows in Redis.
func NewClusterCollector(src ClusterSource) prometheus.Collector { return clusterCollector{src} }

func (clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descClusterFallbacks
	ch <- descClusterUp
}

func (c clusterCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.ClusterStats()
	up := 0.0
	if s.Up {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(descClusterFallbacks, prometheus.CounterValue, float64(s.Fallbacks), s.Policy)
	ch <- prometheus.MustNewConstMetric(descClusterUp, prometheus.GaugeValue, up)
}
