// Package kafkatest runs franz-go's in-process Kafka (kfake) for tests:
// no Kafka broker can be installed on the machines the tests run on, and
// kfake speaks the Kafka protocol (produce, fetch, idempotent
// producers, SASL, TLS). It keeps its data in the test's directory,
// fsynced on every write, so a restart on the same port keeps what it
// acknowledged, as a broker does.
package kafkatest

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/devicegate/devicegate/internal/freeport"
)

// Cluster is a one-broker kfake cluster.
type Cluster struct {
	// Addr is the broker's "127.0.0.1:port", the same across Restart.
	Addr string
	t    testing.TB
	port int
	dir  string
	opts []kfake.Opt
	c    *kfake.Cluster
}

// Start runs a broker on a free loopback port with the given topics
// (partitions each) and options, closed at the test's end.
func Start(t testing.TB, partitions int32, topics []string, opts ...kfake.Opt) *Cluster {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	k := &Cluster{Addr: addr, t: t, dir: t.TempDir()}
	k.port, _ = strconv.Atoi(port)
	k.opts = append([]kfake.Opt{kfake.NumBrokers(1), kfake.Ports(k.port), kfake.DataDir(k.dir), kfake.SyncWrites(),
		kfake.SeedTopics(partitions, topics...)}, opts...)
	k.start()
	t.Cleanup(k.Close)
	return k
}

func (k *Cluster) start() {
	k.t.Helper()
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for {
		// The port of a broker just closed can take a moment to be free.
		if k.c, err = kfake.NewCluster(k.opts...); err == nil {
			return
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("kfake on %s: %v", k.Addr, err)
		}
		time.Sleep(10 * time.Millisecond) // polling for the port
	}
}

// Close stops the broker; its data stays in its directory. Safe to call
// more than once.
func (k *Cluster) Close() {
	if k.c != nil {
		k.c.Close()
		k.c = nil
	}
}

// Restart starts the broker again after Close, on the same port, with
// what it had stored.
func (k *Cluster) Restart() {
	k.t.Helper()
	if k.c != nil {
		k.t.Fatal("kafkatest: Restart before Close")
	}
	k.start()
}

// Records reads all that topic holds (up to its partitions' high
// watermarks), in each partition's order, or fails the test after 30 s;
// the client is given opts too (SASL, TLS).
func (k *Cluster) Records(topic string, opts ...kgo.Opt) []*kgo.Record {
	k.t.Helper()
	var n int64
	for _, p := range k.c.PartitionInfos(topic) {
		n += p.HighWatermark - p.LogStartOffset
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(k.Addr), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, opts...)...)
	if err != nil {
		k.t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*kgo.Record
	for int64(len(out)) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			k.t.Fatalf("%d records of %s after 30s, want %d", len(out), topic, n)
		}
		fs.EachError(func(t string, p int32, err error) { k.t.Logf("fetch %s/%d: %v", t, p, err) })
		out = append(out, fs.Records()...)
	}
	return out
}

// Control adds a control function for requests of key (kfake's
// ControlKey: handled requests get its answer, or none when both are
// nil; the function is dropped after one request unless it calls
// KeepControl).
func (k *Cluster) Control(key kmsg.Key, fn func(kmsg.Request) (kmsg.Response, error, bool)) {
	k.c.ControlKey(int16(key), fn)
}

// KeepControl keeps the running control function for the next request.
func (k *Cluster) KeepControl() { k.c.KeepControl() }

// SetTopicConfig sets a topic's config key to value (an
// IncrementalAlterConfigs request), failing the test if the broker
// refuses.
func (k *Cluster) SetTopicConfig(topic, key, value string) {
	k.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Addr))
	if err != nil {
		k.t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeTopic
	res.ResourceName = topic
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Value, c.Op = key, kmsg.StringPtr(value), kmsg.IncrementalAlterConfigOpSet
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Resources) == 1 {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	if err != nil {
		k.t.Fatalf("set %s=%s on topic %s: %v", key, value, topic, err)
	}
}
