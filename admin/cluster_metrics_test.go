package admin

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

type fixedCluster ClusterStats

func (f fixedCluster) ClusterStats() ClusterStats { return ClusterStats(f) }

// TestClusterCollectorGrants: owner mode's group grant counters are
// exported under their documented names, by unit where they count
// units, the entries held as a gauge; without owner mode none is.
func TestClusterCollectorGrants(t *testing.T) {
	src := fixedCluster{Policy: "closed", Up: true, Owner: &OwnerStats{Owned: 3,
		GrantClaims: 30, GrantRefused: 2, GrantFailed: 1, GrantUnits: [2]uint64{527, 12540}, GrantReturned: [2]uint64{30, 540}, Grants: 7}}
	want := `
# HELP devicegate_cluster_group_grant_claims_total Group grant claims this gateway sent to Redis (owner mode), one script call each.
# TYPE devicegate_cluster_group_grant_claims_total counter
devicegate_cluster_group_grant_claims_total 30
# HELP devicegate_cluster_group_grant_failed_total Group grant claims that failed or were not sent because Redis was away: the decision took the failure policy.
# TYPE devicegate_cluster_group_grant_failed_total counter
devicegate_cluster_group_grant_failed_total 1
# HELP devicegate_cluster_group_grant_refused_total Group grant claims Redis refused: a window of the group had no room for the message.
# TYPE devicegate_cluster_group_grant_refused_total counter
devicegate_cluster_group_grant_refused_total 2
# HELP devicegate_cluster_group_grant_returned_units_total Unused units of group grants this gateway gave back to Redis (owner mode), by unit.
# TYPE devicegate_cluster_group_grant_returned_units_total counter
devicegate_cluster_group_grant_returned_units_total{unit="bytes"} 540
devicegate_cluster_group_grant_returned_units_total{unit="messages"} 30
# HELP devicegate_cluster_group_grant_units_total Units of group windows this gateway's grant claims were granted (owner mode), by unit.
# TYPE devicegate_cluster_group_grant_units_total counter
devicegate_cluster_group_grant_units_total{unit="bytes"} 12540
devicegate_cluster_group_grant_units_total{unit="messages"} 527
# HELP devicegate_cluster_group_grants Groups this gateway holds grant state for (owner mode).
# TYPE devicegate_cluster_group_grants gauge
devicegate_cluster_group_grants 7
# HELP devicegate_cluster_owned_devices Devices in this gateway's owner table (owner mode): those it decides for, being claimed or just lost.
# TYPE devicegate_cluster_owned_devices gauge
devicegate_cluster_owned_devices 3
`
	names := []string{"devicegate_cluster_group_grant_claims_total", "devicegate_cluster_group_grant_failed_total",
		"devicegate_cluster_group_grant_refused_total", "devicegate_cluster_group_grant_returned_units_total",
		"devicegate_cluster_group_grant_units_total", "devicegate_cluster_group_grants", "devicegate_cluster_owned_devices"}
	if err := testutil.CollectAndCompare(NewClusterCollector(src), strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	src.Owner = nil
	if n := testutil.CollectAndCount(NewClusterCollector(src), names...); n != 0 {
		t.Fatalf("%d grant or owner series without owner mode, want none", n)
	}
}
