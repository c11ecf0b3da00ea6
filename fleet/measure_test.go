package fleet

import (
	"testing"
	"time"
)

// TestParseRedisInfo: every command's calls count, scripts' own calls
// included (they have their own cmdstat lines), the INFO that reads
// them excluded; CPU is system plus user.
func TestParseRedisInfo(t *testing.T) {
	info := "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=500,usec_per_call=50.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_get:calls=20,usec=20\r\ncmdstat_info:calls=7,usec=70\r\n# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:0.250000\r\n"
	s := parseRedisInfo(info)
	if s.Commands != 30 || s.ByCommand["evalsha"] != 10 || s.ByCommand["get"] != 20 || s.ByCommand["info"] != 0 {
		t.Fatalf("got %+v, want 30 commands: evalsha 10, get 20, info not counted", s)
	}
	if s.CPU != 1750*time.Millisecond {
		t.Fatalf("CPU %s, want 1.75s", s.CPU)
	}
	d := s.Sub(RedisStats{Commands: 5, ByCommand: map[string]int64{"get": 5}})
	if d.Commands != 25 || d.ByCommand["get"] != 15 || d.Top(1)[0] != "get 15" {
		t.Fatalf("difference %+v, top %v", d, d.Top(1))
	}
}

// TestNodeFailed reads CLUSTER NODES: a node flagged fail is failed, one
// only suspected (fail?) or another address is not.
func TestNodeFailed(t *testing.T) {
	nodes := "07c3 127.0.0.1:30001@40001 master,fail - 0 0 1 disconnected\n" +
		"67ed 127.0.0.1:30002@40002 master,fail? - 0 0 2 connected 5461-10922\n" +
		"292f 127.0.0.1:30004@40004 myself,master - 0 0 4 connected 0-5460\n"
	for addr, want := range map[string]bool{"127.0.0.1:30001": true, "127.0.0.1:30002": false, "127.0.0.1:30004": false, "127.0.0.1:3000": false} {
		if got := nodeFailed(nodes, addr); got != want {
			t.Errorf("nodeFailed(%s) = %v, want %v", addr, got, want)
		}
	}
}
