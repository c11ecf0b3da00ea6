package cluster

import (
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// newLimiter starts a limiter on srv with the given bucket count and
// policy, closed at the test's end.
func newLimiter(t testing.TB, srv *redistest.Server, buckets int, policy Policy, timeout time.Duration) (*Limiter, *devicelimit.Table) {
	t.Helper()
	tab, err := devicelimit.NewTable(buckets)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(ClientOptions(srv.Addr, timeout))
	t.Cleanup(func() { rdb.Close() })
	l, err := New(Options{Client: rdb, Local: tab, Timeout: timeout, Policy: policy, RetryInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l, tab
}

func gomaxprocs() int { return runtime.GOMAXPROCS(0) }

// frozenOwner starts an owner with opts, waits for its first liveness
// renewal, then freezes srv (SIGSTOP; resumed at the test's end).
func frozenOwner(t *testing.T, srv *redistest.Server, opts OwnerOptions) *Owner {
	t.Helper()
	o, err := NewOwner(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Close)
	waitLeased(t, o)
	srv.Stop()
	t.Cleanup(srv.Cont)
	return o
}
