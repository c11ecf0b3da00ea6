package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// Density mode (make bench-density): how much memory one idle MQTT
// connection costs each server. N clients connect (MQTT 3.1.1 CONNECT,
// keepalive 0, so nothing is sent after the CONNACK) from several
// loopback source addresses, 20,000 per address so ephemeral ports are
// not the limit, and stay; the server's anonymous resident memory
// (RssAnon) before and after, settled, gives KB per connection. For the
// gateway, its /metrics adds the Go heap in use, the goroutine stacks and
// the goroutines per connection.

// densityOptions are the density mode's flags.
type densityOptions struct {
	conns   int
	targets string
	gwKeys  string // more YAML for the gateway's mqtt: section
	profile string
}

// perSource is the number of connections made from one source address.
const perSource = 20_000

// densityTarget is a server under test: its process, MQTT address and,
// for the gateway, its admin address.
type densityTarget struct {
	name  string
	p     *proc
	addr  string
	admin string
	pprof string
}

// densityResult is one target's measurement.
type densityResult struct {
	conns                  int
	before, after          int64 // RssAnon bytes
	heap, stack, routines  [2]float64
	connectTime, settledIn time.Duration
	collected              bool // measured after four forced collections
}

func densityBench(ctx context.Context, dir string, o densityOptions, mosquitto string) error {
	// This process holds the clients' ends, each server its own: each
	// needs a descriptor per connection and some.
	if err := raiseFileLimit(o.conns + 1000); err != nil {
		return err
	}
	var results []densityResult
	var names []string
	for k, name := range strings.Split(o.targets, ",") {
		tg, err := startDensityTarget(dir, name, o, mosquitto)
		if err != nil {
			return err
		}
		// Each target's clients come from addresses of their own: the
		// previous target's closed connections hold their ports a while
		// (TIME_WAIT).
		res, err := measureDensity(ctx, tg, o, byte(k+1))
		tg.p.stop()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Fprintf(os.Stderr, "%s: %d connections in %s, RssAnon %.1f -> %.1f MiB\n", name, res.conns,
			res.connectTime.Round(time.Millisecond), float64(res.before)/(1<<20), float64(res.after)/(1<<20))
		results = append(results, res)
		names = append(names, name)
	}
	printDensity(os.Stdout, o, names, results)
	return nil
}

// raiseFileLimit raises this process's open-file limit (which the
// servers it starts inherit) to at least n, raising the hard limit too
// when it is lower (root may).
func raiseFileLimit(n int) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Cur >= uint64(n) {
		return nil
	}
	hard := lim.Max
	if lim.Max < uint64(n) {
		lim.Max = uint64(n)
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("%d connections need an open-file limit of %d; the hard limit is %d and raising it was refused (%w): it takes CAP_SYS_RESOURCE (root outside a container), e.g. ulimit -Hn %d before make bench-density", n-1000, n, hard, err, n)
	}
	return nil
}

// densityGatewayConfig is the gateway at its defaults, on free ports.
const densityGatewayConfig = `mqtt:
  tcp: "127.0.0.1:0"
%s
admin: {addr: "127.0.0.1:0"}
data_dir: %q
`

func startDensityTarget(dir, name string, o densityOptions, mosquitto string) (*densityTarget, error) {
	tg := &densityTarget{name: name}
	var err error
	switch name {
	case "gateway":
		conf := dir + "/density-gateway.yaml"
		keys := ""
		for _, l := range strings.Split(o.gwKeys, "\n") {
			if strings.TrimSpace(l) != "" {
				keys += "  " + l + "\n"
			}
		}
		if err := os.WriteFile(conf, fmt.Appendf(nil, densityGatewayConfig, keys, dir+"/density-data"), 0o644); err != nil {
			return nil, err
		}
		var env []string
		if o.profile != "" {
			if tg.pprof, err = freePort(); err != nil {
				return nil, err
			}
			env = append(env, "BENCH_PPROF_ADDR="+tg.pprof)
		}
		if tg.p, err = start(dir, "density-gateway", env, dir+"/gateway", "serve", "--config", conf); err != nil {
			return nil, err
		}
		if tg.addr, err = tg.p.waitLog(regexp.MustCompile(`msg="mqtt listening" addr=(\S+)`), 15*time.Second); err != nil {
			return tg, err
		}
		tg.admin, err = tg.p.waitLog(regexp.MustCompile(`msg="admin listening" addr=(\S+)`), 15*time.Second)
	case "mochi":
		if tg.p, err = start(dir, "density-mochi", nil, dir+"/plainmochi", "-addr", "127.0.0.1:0"); err != nil {
			return nil, err
		}
		tg.addr, err = tg.p.waitLog(regexp.MustCompile(`^listening (\S+)`), 10*time.Second)
	case "mosquitto":
		tg.addr, _, tg.p, err = startMosquittoConf(dir, mosquitto, "density-mosquitto", "")
	default:
		return nil, fmt.Errorf("-density-targets: unknown target %q (want gateway, mochi, mosquitto)", name)
	}
	if err != nil && tg.p != nil {
		tg.p.stop()
	}
	return tg, err
}

// measureDensity connects o.conns idle clients to tg and measures.
func measureDensity(ctx context.Context, tg *densityTarget, o densityOptions, net3 byte) (densityResult, error) {
	var res densityResult
	res.conns = o.conns
	time.Sleep(time.Second) // let start-up work finish
	var err error
	if res.before, err = rssAnon(tg.p); err != nil {
		return res, err
	}
	if tg.admin != "" {
		if res.heap[0], res.stack[0], res.routines[0], err = goMetrics(ctx, tg.admin); err != nil {
			return res, err
		}
	}
	t0 := time.Now()
	conns, err := connectIdle(ctx, tg.addr, o.conns, net3)
	defer func() {
		for _, c := range conns {
			// A reset, not a FIN: no TIME_WAIT holding the port.
			_ = c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
	}()
	if err != nil {
		return res, err
	}
	res.connectTime = time.Since(t0)
	// Settled: RssAnon changes by less than 1% over a second.
	t1 := time.Now()
	prev, _ := rssAnon(tg.p)
	for range 30 {
		time.Sleep(time.Second)
		cur, err := rssAnon(tg.p)
		if err != nil {
			return res, err
		}
		if d := cur - prev; d < prev/100 && d > -prev/100 {
			break
		}
		prev = cur
	}
	res.settledIn = time.Since(t1)
	if res.after, err = rssAnon(tg.p); err != nil {
		return res, err
	}
	if tg.pprof != "" {
		// With -profile the gateway serves pprof: four collections, as
		// the runtime's own every two minutes would make over time,
		// shrink the goroutine stacks that can shrink (the figures from
		// /metrics below; the resident memory above is before them).
		for range 4 {
			if err := fetch(ctx, "http://"+tg.pprof+"/debug/pprof/heap?gc=1", os.DevNull); err != nil {
				return res, err
			}
		}
		time.Sleep(time.Second)
		res.collected = true
	}
	if tg.admin != "" {
		if res.heap[1], res.stack[1], res.routines[1], err = goMetrics(ctx, tg.admin); err != nil {
			return res, err
		}
	}
	if o.profile != "" && tg.pprof != "" {
		err = densityProfiles(ctx, tg, o) // the connections still open
	}
	return res, err
}

// connectIdle opens n MQTT 3.1.1 connections to addr from 127.net3.0.1,
// 127.net3.0.2, ... (perSource each), each CONNECTed with keepalive 0
// and its CONNACK read, and returns them open.
func connectIdle(ctx context.Context, addr string, n int, net3 byte) ([]net.Conn, error) {
	conns := make([]net.Conn, n)
	var next int64
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for {
				mu.Lock()
				i := int(next)
				next++
				stop := first != nil || i >= n || ctx.Err() != nil
				mu.Unlock()
				if stop {
					return
				}
				c, err := connectOne(addr, i, net3)
				mu.Lock()
				if err != nil && first == nil {
					first = fmt.Errorf("connection %d: %w", i, err)
				}
				conns[i] = c
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	out := conns[:0]
	for _, c := range conns {
		if c != nil {
			out = append(out, c)
		}
	}
	return out, first
}

// connectOne makes idle connection i.
func connectOne(addr string, i int, net3 byte) (net.Conn, error) {
	src := &net.TCPAddr{IP: net.IPv4(127, net3, byte(i/perSource/254), byte(1+i/perSource%254))}
	d := net.Dialer{LocalAddr: src, Timeout: 10 * time.Second, Control: bindNoPort}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: 4,
		Connect: packets.ConnectParams{
			ProtocolName:     []byte("MQTT"),
			Clean:            true,
			Keepalive:        0,
			ClientIdentifier: fmt.Sprintf("idle-%07d", i),
		},
	}
	var b bytes.Buffer
	if err := pk.ConnectEncode(&b); err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(b.Bytes()); err != nil {
		c.Close()
		return nil, err
	}
	ack := make([]byte, 4)
	if _, err := io.ReadFull(c, ack); err != nil {
		c.Close()
		return nil, fmt.Errorf("read CONNACK: %w", err)
	}
	if ack[0] != packets.Connack<<4 || ack[3] != 0 {
		c.Close()
		return nil, fmt.Errorf("CONNACK % x: refused", ack)
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// ipBindAddressNoPort is Linux's IP_BIND_ADDRESS_NO_PORT: a socket bound
// to a source address takes its port at connect, unique per 4-tuple,
// instead of reserving one at bind (which would exhaust the ephemeral
// range for every other connection of the machine).
const ipBindAddressNoPort = 24

func bindNoPort(_, _ string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, ipBindAddressNoPort, 1)
	})
	if err != nil {
		return err
	}
	return serr
}

// goMetrics reads the Go heap in use, the goroutine stacks in use and
// the goroutines from a gateway's /metrics.
func goMetrics(ctx context.Context, admin string) (heap, stack, routines float64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/metrics", nil)
	if err != nil {
		return 0, 0, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, 0, err
	}
	defer resp.Body.Close()
	found := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		f, perr := strconv.ParseFloat(v, 64)
		if perr != nil {
			continue
		}
		switch name {
		case "go_memstats_heap_inuse_bytes":
			heap, found = f, found+1
		case "go_memstats_stack_inuse_bytes":
			stack, found = f, found+1
		case "go_goroutines":
			routines, found = f, found+1
		}
	}
	if found != 3 {
		return 0, 0, 0, errors.New("the gateway's /metrics lacks go_memstats_heap_inuse_bytes, go_memstats_stack_inuse_bytes or go_goroutines")
	}
	return heap, stack, routines, sc.Err()
}

// densityProfiles writes the gateway's heap and goroutine profiles, with
// the connections still open.
func densityProfiles(ctx context.Context, tg *densityTarget, o densityOptions) error {
	if err := os.MkdirAll(o.profile, 0o755); err != nil {
		return err
	}
	for _, p := range []struct{ path, file string }{
		{"/debug/pprof/heap", "density-heap.pprof"},
		{"/debug/pprof/goroutine", "density-goroutine.pprof"},
	} {
		if err := fetch(ctx, "http://"+tg.pprof+p.path, o.profile+"/"+p.file); err != nil {
			return err
		}
	}
	return nil
}

func printDensity(w io.Writer, o densityOptions, names []string, rs []densityResult) {
	fmt.Fprintf(w, "\n%d idle MQTT 3.1.1 connections (keepalive 0), resident anonymous memory added per connection:\n\n", o.conns)
	fmt.Fprintf(w, "| server | KB per connection | RssAnon before, after (MiB) | connect time |\n|---|---|---|---|\n")
	for i, r := range rs {
		fmt.Fprintf(w, "| %s | %.1f | %.1f, %.1f | %s |\n", names[i], float64(r.after-r.before)/1024/float64(r.conns),
			float64(r.before)/(1<<20), float64(r.after)/(1<<20), r.connectTime.Round(time.Millisecond))
	}
	for i, r := range rs {
		if r.routines[1] == 0 {
			continue
		}
		per := func(v [2]float64) float64 { return (v[1] - v[0]) / float64(r.conns) }
		gc := ""
		if r.collected {
			gc = " (after four forced collections)"
		}
		fmt.Fprintf(w, "\n%s, per connection%s: Go heap in use %.1f KB, goroutine stacks %.1f KB, %.2f goroutines (%.1f KB of stack each)\n",
			names[i], gc, per(r.heap)/1024, per(r.stack)/1024, per(r.routines), per(r.stack)/per(r.routines)/1024)
	}
}
