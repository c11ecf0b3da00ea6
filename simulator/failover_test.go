package simulator

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// relay is a loopback TCP relay to a gateway that records the source IP
// of every connection and can cut them all, as a gateway dying would.
type relay struct {
	l       net.Listener
	mu      sync.Mutex
	sources map[string]int
	conns   []net.Conn
	down    bool
}

func startRelay(t *testing.T, to string) *relay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{l: l, sources: map[string]int{}}
	t.Cleanup(func() { r.cut(); l.Close() })
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			if r.down {
				r.mu.Unlock()
				in.Close()
				continue
			}
			r.sources[in.RemoteAddr().(*net.TCPAddr).IP.String()]++
			out, err := net.Dial("tcp", to)
			if err != nil {
				r.mu.Unlock()
				in.Close()
				continue
			}
			r.conns = append(r.conns, in, out)
			r.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); out.Close() }()
			go func() { _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
	return r
}

// cut closes every relayed connection and refuses new ones.
func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = true
	for _, c := range r.conns {
		c.Close()
	}
}

func (r *relay) seen() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.sources {
		out[k] = v
	}
	return out
}

// TestRunSourceAddrs: device i dials from SourceAddrs[i mod n], and
// only from those; a source that is not loopback is refused.
func TestRunSourceAddrs(t *testing.T) {
	q := devicelimit.Quota{Limit: 100, Window: time.Second, Policy: devicelimit.PolicyDrop}
	gw := startGateway(t, q)
	r := startRelay(t, gw)
	rep, err := Run(context.Background(), Config{
		Addr: r.l.Addr().String(), SubAddrs: []string{gw}, SourceAddrs: []string{"127.0.0.2", "127.0.0.3"},
		Devices: 4, Rate: 5, QoS: 1, Duration: 500 * time.Millisecond, Drain: 500 * time.Millisecond, Quota: q, Client: ClientLean,
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.seen(); len(got) != 2 || got["127.0.0.2"] != 2 || got["127.0.0.3"] != 2 {
		t.Fatalf("connections by source: %v, want 2 from 127.0.0.2 and 2 from 127.0.0.3", got)
	}
	if !rep.Verdict.OK {
		t.Fatalf("verdict %+v, errors %v", rep.Verdict, rep.Errors)
	}
	_, err = Run(context.Background(), Config{Addr: gw, SourceAddrs: []string{"192.0.2.1"}, Devices: 1, Rate: 1, Duration: time.Second, Quota: q})
	if err == nil {
		t.Fatal("a source address that is not loopback was accepted")
	}
}

// TestRunFailoverToNextAddr: with Failover, the devices of a gateway
// that goes away (its connections cut, new ones refused) move to the
// next address of their list, send again at once and are admitted
// there; the window check holds, and Readmitted says when.
func TestRunFailoverToNextAddr(t *testing.T) {
	q := devicelimit.Quota{Limit: 100, Window: time.Second, Policy: devicelimit.PolicyDrop}
	gw := startGateway(t, q)
	dying := startRelay(t, gw)
	var cutAt time.Time
	cfg := Config{
		Addrs: []string{dying.l.Addr().String(), gw}, SubAddrs: []string{gw}, Failover: true,
		Devices: 6, Rate: 2, QoS: 1, Duration: 3 * time.Second, Drain: time.Second, Quota: q, Client: ClientLean,
	}
	cfg.Progress = func(p Progress) {
		if p.Elapsed >= time.Second && cutAt.IsZero() {
			cutAt = time.Now()
			dying.cut()
		}
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if dying.seen()["127.0.0.1"] != 3 {
		t.Fatalf("devices that started on the first address: %v, want 3 (devices 0, 2, 4)", dying.seen())
	}
	if len(rep.Failovers) != 3 || len(rep.Readmitted) != 3 {
		t.Fatalf("failovers %v, readmitted %v: want the 3 devices of the cut address", rep.Failovers, rep.Readmitted)
	}
	for _, at := range rep.Readmitted {
		if at.Before(cutAt) {
			t.Fatalf("readmitted at %v, before the cut at %v", at, cutAt)
		}
	}
	if rep.Result.Totals.Violations != 0 || rep.Result.Totals.Lost != 0 || rep.Result.Totals.Sent == 0 {
		t.Fatalf("totals %+v", rep.Result.Totals)
	}
}
