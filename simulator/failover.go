package simulator

import (
	"context"
	"fmt"
	"net"
	"slices"
	"time"
)

// Several gateways (Config.Addrs, SubAddrs, Failover): a fleet spread
// over the gateways of a cluster the way device SDKs spread it, each
// device holding a list of addresses and moving to the next one when a
// connect fails or its connection is lost.

// addr returns where device i connects now: Addrs[(i+hops) mod n], or
// Addr.
func (f *fleet) addr(i int) string {
	if len(f.cfg.Addrs) == 0 {
		return f.cfg.Addr
	}
	return f.cfg.Addrs[(i+int(f.hops[i]))%len(f.cfg.Addrs)]
}

// auth returns the Auth device i dials with: Config.Auth, from its
// source address when Config.SourceAddrs has some.
func (f *fleet) auth(i int) Auth {
	a := f.cfg.Auth
	if n := len(f.cfg.SourceAddrs); n > 0 {
		a.source = &net.TCPAddr{IP: net.ParseIP(f.cfg.SourceAddrs[i%n])}
	}
	return a
}

// hop moves device i to its next address; only device i's goroutine
// calls it.
func (f *fleet) hop(i int) {
	if len(f.cfg.Addrs) > 1 {
		f.hops[i]++
	}
}

// subscribeAll connects the run's subscribers: one at each of
// Config.SubAddrs, or the one of subscribe.
func subscribeAll(ctx context.Context, cfg Config, rec *recorder) ([]*subscriber, error) {
	if len(cfg.SubAddrs) == 0 {
		s, err := subscribe(ctx, cfg, rec)
		if err != nil {
			return nil, err
		}
		return []*subscriber{s}, nil
	}
	var subs []*subscriber
	for _, addr := range cfg.SubAddrs {
		s, err := subscribeAt(ctx, cfg, rec, addr, false, true)
		if err != nil {
			for _, s := range subs {
				s.close()
			}
			return nil, err
		}
		subs = append(subs, s)
	}
	return subs, nil
}

// failedOver records a device that lost its connection at lost having
// a message admitted again, elsewhere, at again.
func (r *recorder) failedOver(lost, again time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failovers = append(r.failovers, again.Sub(lost))
	r.readmitted = append(r.readmitted, again)
}

// lostConnection records a connection lost under Config.Failover.
func (r *recorder) lostConnection(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.disconnects++
	r.note(err)
}

// FailoverTimes are, for every connection lost under Config.Failover
// (a gateway killed, a connection cut), the time until the device had a
// message admitted again, ascending.
type FailoverTimes []time.Duration

// Quantile returns the q-quantile (0 < q <= 1) of the times: how long
// until that share of the moved devices was admitted again; 0 when
// there are none.
func (ft FailoverTimes) Quantile(q float64) time.Duration {
	if len(ft) == 0 {
		return 0
	}
	i := int(q*float64(len(ft))+0.999999) - 1
	return ft[min(max(i, 0), len(ft)-1)]
}

// sortedFailovers returns the recorded failover times and the instants
// of readmission, each ascending.
func (r *recorder) sortedFailovers() (FailoverTimes, []time.Time) {
	out := append(FailoverTimes(nil), r.failovers...)
	slices.Sort(out)
	at := append([]time.Time(nil), r.readmitted...)
	slices.SortFunc(at, time.Time.Compare)
	return out, at
}

// validateAddrs checks Addrs and SubAddrs and makes Addr the first of
// Addrs when it is empty.
func (c *Config) validateAddrs() error {
	if c.Addr == "" && len(c.Addrs) > 0 {
		c.Addr = c.Addrs[0]
	}
	for _, list := range [][]string{c.Addrs, c.SubAddrs} {
		for _, a := range list {
			if err := checkLoopback(a); err != nil {
				return err
			}
		}
	}
	for _, a := range c.SourceAddrs {
		if ip := net.ParseIP(a); ip == nil || !ip.IsLoopback() {
			return fmt.Errorf("%w: source_addrs: %q is not a loopback IP address", ErrInvalidConfig, a)
		}
	}
	if c.SubAddr != "" && len(c.SubAddrs) > 0 {
		return fmt.Errorf("%w: sub_addr and sub_addrs: choose one", ErrInvalidConfig)
	}
	return nil
}

// pubackLatency returns the percentiles of send-to-PUBACK latency over
// every message sent from since on that had a PUBACK.
func pubackLatency(logs []DeviceLog, since time.Time) Latency {
	var all []time.Duration
	for _, l := range logs {
		for _, s := range l.Sent {
			if s.Ack != AckNone && !s.At.Before(since) {
				all = append(all, s.AckAt.Sub(s.At))
			}
		}
	}
	return latencyOf(all)
}

// latencyOf returns the percentiles of ds, which it sorts.
func latencyOf(ds []time.Duration) Latency {
	slices.Sort(ds)
	var lat Latency
	lat.LatencyP50, lat.LatencyP95, lat.LatencyP99, lat.LatencyMax = percentiles(ds)
	return lat
}
