package broker

import (
	"encoding/base64"
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/argon2"

	"github.com/devicegate/devicegate/auth"
)

// TestWrongPasswordFloodMemoryBounded: every wrong password costs a full
// argon2id run, which allocates the hash's memory cost. A flood of
// wrong-password CONNECTs (one address, loopback, so no connection rate
// applies) must not run them all at once: the gateway's heap would grow
// by the memory cost per connection in flight.
func TestWrongPasswordFloodMemoryBounded(t *testing.T) {
	const memKiB = 16 << 10 // 16 MiB per verification
	salt := []byte("0123456789abcdef")
	key := argon2.IDKey([]byte("right"), salt, 1, memKiB, 1, 32)
	e := auth.Entry{Username: "big", Hash: fmt.Sprintf("$argon2id$v=19$m=%d,t=1,p=1$%s$%s", memKiB,
		base64.RawStdEncoding.EncodeToString(salt), base64.RawStdEncoding.EncodeToString(key))}
	creds, err := auth.New([]auth.Entry{e})
	if err != nil {
		t.Fatal(err)
	}
	f := start(t, fixtureOpts{options: func(o *Options) { o.Auth = Auth{Credentials: creds, ACL: defaultACL(t)} }})

	defer debug.SetGCPercent(debug.SetGCPercent(10)) // heap follows what is live
	runtime.GC()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(sample)
	base := sample[0].Value.Uint64()
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond): // sampling, not letting time pass
			}
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > peak.Load() {
				peak.Store(v)
			}
		}
	}()

	flood := 3*runtime.GOMAXPROCS(0) + 6 // unbounded, the heap would pass the limit below
	var wg sync.WaitGroup
	for range flood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			refusedWith(t, dialTCP(t, f.addr), login{"big", "big", "wrong"}, 0x86)
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled

	growth := int64(peak.Load()) - int64(base)
	limit := int64(2*runtime.GOMAXPROCS(0)+2) * memKiB << 10
	t.Logf("heap grew by %d MiB at most during %d concurrent wrong passwords (argon2id m=%d MiB, GOMAXPROCS %d); bound %d MiB",
		growth>>20, flood, memKiB>>10, runtime.GOMAXPROCS(0), limit>>20)
	if growth > limit {
		t.Fatalf("heap grew by %d MiB, over %d MiB: password checks run without a bound on concurrency", growth>>20, limit>>20)
	}
}
