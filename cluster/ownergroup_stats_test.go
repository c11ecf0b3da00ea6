package cluster

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// grantCalls counts the grant script calls srv runs (MONITOR on a
// connection of its own: EVALSHA of grantScript's hash, the script
// loaded beforehand so that none is an EVAL) until stop is called,
// which returns the count once every command sent before it was seen.
func grantCalls(t *testing.T, srv *redistest.Server) (stop func() int64) {
	t.Helper()
	ctx := context.Background()
	c := srv.Client()
	if err := grantScript.Load(ctx, c).Err(); err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rd := bufio.NewReader(conn)
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		t.Fatalf("MONITOR answered %q, %v", line, err)
	}
	marker := fmt.Sprintf("grant-calls-end-%d", time.Now().UnixNano())
	want := strings.ToLower(`"evalsha" "` + grantScript.Hash() + `"`)
	var n int64
	done := make(chan error, 1)
	go func() {
		for {
			line, err := rd.ReadString('\n')
			switch {
			case err != nil:
				done <- err
				return
			case strings.Contains(strings.ToLower(line), want):
				n++
			case strings.Contains(line, marker):
				done <- nil
				return
			}
		}
	}()
	return func() int64 {
		t.Helper()
		if err := c.Echo(ctx, marker).Err(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("MONITOR: %v", err)
		}
		conn.Close()
		return n
	}
}

// TestOwnerGroupGrantStats: the grant counters (devicegate_cluster_group_grant_*,
// admin/cluster_metrics.go) agree with what Redis saw. Two gateways
// fill a group of a message and a byte window: the claims they count
// are the grant script calls MONITOR shows; some are refused (the group
// full); each gateway was granted at least what it admitted; what both
// were granted less what they gave back is what the group's rings hold.
// With Redis killed, a claim on a new group fails and is counted so.
func TestOwnerGroupGrantStats(t *testing.T) {
	srv := redistest.Start(t)
	gws := [2]*Owner{grantOwner(t, srv, 10).o, grantOwner(t, srv, 10).o}
	stop := grantCalls(t, srv)
	q := devicelimit.Quota{Limit: 100000, Window: time.Hour}
	group := devicelimit.GroupKey("acme")
	gq := devicelimit.Quota{NWindows: 2, Windows: [devicelimit.MaxWindows]devicelimit.Limit{
		{Unit: devicelimit.Messages, N: 500, Window: time.Hour},
		{Unit: devicelimit.Bytes, N: 12000, Window: 45 * time.Minute},
	}}
	const size = 30
	var admitted [2]int
	now := t0
	for s := range 2000 { // 20 min and 10 s of the injected clock: nothing leaves a window
		for i, o := range gws {
			// Gateway 0 sends twice as often: its grants grow, and some
			// of them end their span unused (given back).
			if i == 1 && s%2 == 1 {
				continue
			}
			if o.AllowGroupAt(fmt.Sprintf("gw%d-dev-%d", i, s%4), "", q, group, gq, size, now).Allowed {
				admitted[i]++
			}
		}
		if s == 100 {
			// The grants' spans end (18 and 13.5 min at most): their
			// rests are given back with the next claims.
			now = now.Add(20 * time.Minute)
		}
		now = now.Add(5 * time.Millisecond)
	}
	calls := stop()
	var st [2]OwnerStats
	var claims, refused, failed uint64
	var units, back [2]uint64
	for i, o := range gws {
		st[i] = o.Stats()
		claims += st[i].GrantClaims
		refused += st[i].GrantRefused
		failed += st[i].GrantFailed
		for u := range units {
			units[u] += st[i].GrantUnits[u]
			back[u] += st[i].GrantReturned[u]
		}
		t.Logf("gateway %d: admitted %d; %+v", i, admitted[i], st[i])
	}
	// The rings' counts, read by a gateway holding no grant on the
	// group (a standing from a grant entry adds that gateway's unused
	// grant back).
	var s devicelimit.Standing
	grantOwner(t, srv, 10).o.groupStanding(group, gq, 0, false, now, &s)
	if s.N != 2 {
		t.Fatalf("standing of %d windows, want 2", s.N)
	}
	held := [2]uint64{uint64(500 - s.Windows[0].Remaining), uint64(12000 - s.Windows[1].Remaining)}
	t.Logf("redis ran %d grant calls; the gateways counted %d claims (%d refused, %d failed); granted %v, given back %v; the rings hold %v",
		calls, claims, refused, failed, units, back, held)
	if calls != int64(claims) {
		t.Errorf("redis ran %d grant script calls, the gateways counted %d claims", calls, claims)
	}
	if refused == 0 || failed != 0 {
		t.Errorf("%d claims refused (want some: the group was full), %d failed (want none)", refused, failed)
	}
	if back[devicelimit.Messages] == 0 {
		t.Error("no units given back")
	}
	for i := range gws {
		if st[i].GrantUnits[devicelimit.Messages] < uint64(admitted[i]) || st[i].GrantUnits[devicelimit.Bytes] < uint64(size*admitted[i]) {
			t.Errorf("gateway %d admitted %d messages of %d bytes on grants of %v units", i, admitted[i], size, st[i].GrantUnits)
		}
		if st[i].Grants != 1 {
			t.Errorf("gateway %d holds %d grant entries, want 1", i, st[i].Grants)
		}
	}
	if units[0]-back[0] != held[0] || units[1]-back[1] != held[1] {
		t.Errorf("granted %v less given back %v, but the rings hold %v", units, back, held)
	}

	srv.Kill()
	if gws[0].AllowGroupAt("gw0-dev-0", "", q, devicelimit.GroupKey("other"), gq, size, now).Allowed {
		t.Error("admitted on a new group with Redis killed (fail-closed)")
	}
	if f := gws[0].Stats().GrantFailed; f != 1 {
		t.Errorf("%d failed claims counted after a claim with Redis killed, want 1", f)
	}
}
