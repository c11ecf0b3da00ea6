package broker

import (
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// A connection's registry entry, held on its protoConn, goes with its
// removal: a lookup after it finds nothing, and a new entry is found.
func TestRegistryEntryOnConnection(t *testing.T) {
	s, _, _ := newHookClient(t, devicelimit.Quota{Limit: 1, Window: time.Second})
	pc := &protoConn{Conn: discardConn{}}
	cl := s.mqtt.NewClient(pc, "tcp", "dev-3", false)
	inline := s.mqtt.NewClient(nil, "local", "inline", true)
	var r registry
	for _, c := range []*mqtt.Client{cl, inline} {
		first := &connInfo{device: "a"}
		r.setInfo(c, first)
		if got := r.info(c); got != first {
			t.Fatalf("%s: info %p, want %p", c.ID, got, first)
		}
		if got, ok := r.remove(c); !ok || got != first {
			t.Fatalf("%s: remove = %p, %v; want %p, true", c.ID, got, ok, first)
		}
		if got := r.info(c); got != nil {
			t.Fatalf("%s: info after remove %p, want nil", c.ID, got)
		}
		second := &connInfo{device: "b"}
		r.setInfo(c, second)
		if got := r.info(c); got != second {
			t.Fatalf("%s: info %p, want the new entry's %p", c.ID, got, second)
		}
	}
	if pc.reg.Load() == nil {
		t.Fatal("the connection holds no entry")
	}
}
