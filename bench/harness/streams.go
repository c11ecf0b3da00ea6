package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"
)

// streamDest is a stream the forwarding benchmark writes into: the
// forward: entry's keys that choose it.
type streamDest struct {
	name, keys string
	proc       *proc // the stream's server process; nil for kfake
}

// startStreams starts the three streams of `make bench-forward`: a
// redis-server (no persistence, as a cache-like Redis runs), a
// nats-server with a file-backed JetStream stream of bench.>, and
// franz-go's kfake as Kafka (in this process: no Kafka broker can be
// installed here), topic bench in 6 partitions. close ends kfake.
func startStreams(ctx context.Context, dir string, keep func(*proc) *proc) (dests []streamDest, close func(), err error) {
	close = func() {}
	redisAddr, redis, err := startOnFreePort(dir, "redis", "redis-server", keep, func(port string) []string {
		return []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"}
	})
	if err != nil {
		return nil, close, err
	}
	natsAddr, natsProc, err := startOnFreePort(dir, "nats", "nats-server", keep, func(port string) []string {
		return []string{"-a", "127.0.0.1", "-p", port, "-js", "-sd", dir + "/nats"}
	})
	if err == nil {
		err = natsStream(ctx, "nats://"+natsAddr)
	}
	if err != nil {
		return nil, close, err
	}

	kafkaAddr, err := freePort()
	if err != nil {
		return nil, close, err
	}
	_, port, _ := net.SplitHostPort(kafkaAddr)
	n, _ := strconv.Atoi(port)
	kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(n), kfake.SeedTopics(6, "bench"))
	if err != nil {
		return nil, close, fmt.Errorf("kfake: %w", err)
	}
	return []streamDest{
		{"gateway -> redis streams", fmt.Sprintf(`to: "redis://%s", stream: "{topic}"`, redisAddr), redis},
		{"gateway -> nats jetstream", fmt.Sprintf(`to: "nats://%s"`, natsAddr), natsProc},
		{"gateway -> kafka (kfake)", fmt.Sprintf(`to: "kafka://%s", kafka_topic: bench`, kafkaAddr), nil},
	}, kf.Close, nil
}

// startOnFreePort starts program prog (found by findProgram) as name,
// with the arguments args makes of a free loopback port, and waits until
// it listens there.
func startOnFreePort(dir, name, prog string, keep func(*proc) *proc, args func(port string) []string) (string, *proc, error) {
	bin, err := findProgram(prog)
	if err != nil {
		return "", nil, err
	}
	addr, err := freePort()
	if err != nil {
		return "", nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	p, err := start(dir, name, nil, bin, args(port)...)
	keep(p)
	if err != nil {
		return "", nil, err
	}
	return addr, p, waitDial(addr, 10*time.Second)
}

// natsStream creates the JetStream stream BENCH of bench.> (file
// storage), waiting for JetStream to be ready.
func natsStream(ctx context.Context, url string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = js.CreateStream(cctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.>"}, Storage: jetstream.FileStorage})
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond) // JetStream getting ready
	}
}

// streamRound is one round of publishers against g, forwarding into a
// stream (no subscribers): the messages the stream took per second,
// from the round's start until the forward log is empty again, as
// Delivered and DeliveredPS, and the CPU time of dest (the stream's
// server, when not nil) meanwhile.
func streamRound(ctx context.Context, dir string, o options, g *forwardingGateway, dest *proc) (result, error) {
	before, err := g.status(ctx)
	if err != nil {
		return result{}, err
	}
	var destCPU time.Duration
	if dest != nil {
		if destCPU, err = dest.cpu(); err != nil {
			return result{}, err
		}
	}
	res, err := loadRound(ctx, dir, o, g.addr, g.addr, 0, o.duration, g.p)
	if err != nil {
		return res, err
	}
	end := time.Now()
	var after upstream
	for {
		if after, err = g.status(ctx); err != nil {
			return res, err
		}
		if after.Backlog == 0 {
			break
		}
		if time.Since(end) > time.Minute {
			return res, fmt.Errorf("forward log not empty a minute after the round (%d left)", after.Backlog)
		}
		time.Sleep(10 * time.Millisecond) // sampling the forward log
	}
	active := time.Duration(float64(res.Published) / res.ReceivedPS * float64(time.Second))
	if dest != nil {
		cpu, err := dest.cpu()
		if err != nil {
			return res, err
		}
		res.DestCPU = cpu - destCPU
	}
	res.Delivered = after.Forwarded - before.Forwarded
	res.DeliveredPS = float64(res.Delivered) / (active + time.Since(end)).Seconds()
	if res.Delivered < res.Published {
		fmt.Fprintf(os.Stderr, "warning: %d published, %d into the stream\n", res.Published, res.Delivered)
	}
	return res, nil
}
