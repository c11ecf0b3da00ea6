package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/simulator"
)

// Share is one simulator process's part of a fleet: its devices, how
// they publish and where they connect. It travels to a worker process
// as JSON.
type Share struct {
	// IDPattern names the share's devices (one verb for the number);
	// the shares of a fleet have patterns of their own.
	IDPattern string        `json:"id_pattern"`
	Devices   int           `json:"devices"`
	Rate      float64       `json:"rate"`
	Duration  time.Duration `json:"duration_ns"`
	RampUp    float64       `json:"ramp_up,omitempty"`
	Limit     int           `json:"limit"`
	Window    time.Duration `json:"window_ns"`
	// Addrs are the gateways (or the load balancer) devices connect to,
	// as an SDK's list; SubAddrs the gateways whose arrivals are counted.
	Addrs    []string      `json:"addrs"`
	SubAddrs []string      `json:"sub_addrs"`
	StormAt  time.Duration `json:"storm_at_ns,omitempty"`
	// Sources are the loopback addresses the devices dial from, device
	// i from Sources[i mod n]: a gateway bounds its connections that
	// have not sent CONNECT yet per source address (100 by default).
	Sources []string `json:"sources,omitempty"`
	// Tolerance is the checker's slack at window edges.
	Tolerance time.Duration `json:"tolerance_ns"`
}

// ShareResult is what a share's run saw, small enough to send back from
// a worker process.
type ShareResult struct {
	Devices      int              `json:"devices"`
	Totals       simulator.Counts `json:"totals"`
	Violations   int              `json:"violations"`
	WorstWindow  int              `json:"worst_window"`
	AllConnected time.Duration    `json:"all_connected_ns"`
	// ConnectFailures counts devices that never connected.
	ConnectFailures int `json:"connect_failures"`
	// Puback is the share's send-to-PUBACK latency percentiles.
	Puback     simulator.Latency       `json:"puback"`
	Failovers  simulator.FailoverTimes `json:"failovers_ns"`
	Readmitted []time.Time             `json:"readmitted"`
	Errors     []string                `json:"errors,omitempty"`
	// Simulator is the share's process's CPU and peak memory.
	Simulator simulator.Resources `json:"simulator"`
}

// config is the simulator configuration of the share.
func (s Share) config() simulator.Config {
	cfg := simulator.Config{
		Addrs: s.Addrs, SubAddrs: s.SubAddrs, SourceAddrs: s.Sources, Failover: true,
		Devices: s.Devices, IDPattern: s.IDPattern, Rate: s.Rate, Duration: s.Duration, RampUp: s.RampUp,
		Client: simulator.ClientLean, QoS: 1, Protocol: 5,
		Quota:     devicelimit.Quota{Limit: s.Limit, Window: s.Window, Policy: devicelimit.PolicyDrop},
		Tolerance: s.Tolerance, Drain: 5 * time.Second,
	}
	cfg.StormAt = s.StormAt
	return cfg
}

// Run runs the share in this process.
func (s Share) Run(ctx context.Context) (ShareResult, error) {
	rep, err := simulator.Run(ctx, s.config())
	if err != nil {
		return ShareResult{}, err
	}
	return summarize(rep), nil
}

// summarize reduces a report to a ShareResult.
func summarize(rep *simulator.Report) ShareResult {
	r := ShareResult{Devices: rep.Result.Totals.Devices, Totals: rep.Result.Totals.Counts,
		Violations: rep.Result.Totals.Violations, AllConnected: rep.AllConnected, Puback: rep.Puback, ConnectFailures: rep.ConnectFailures,
		Failovers: rep.Failovers, Readmitted: rep.Readmitted, Errors: rep.Errors, Simulator: rep.Simulator}
	for _, d := range rep.Result.Devices {
		r.WorstWindow = max(r.WorstWindow, d.MaxInWindow)
	}
	return r
}

// workerEnv names the environment variable that makes a process (the
// test binary, re-executed) a simulator worker: its value is the path of
// the Share's JSON; the ShareResult goes to the same path + ".out".
const workerEnv = "DEVICEGATE_FLEET_WORKER"

// RunWorker runs the share at path as a worker process would; the exit
// code.
func runWorker(path string) int {
	if _, err := RaiseFileLimit(); err != nil {
		fmt.Fprintln(os.Stderr, "raise the open-file limit:", err)
		return 1
	}
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var s Share
	if err := json.Unmarshal(b, &s); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	res, err := s.Run(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	out, _ := json.Marshal(res)
	if err := os.WriteFile(path+".out", out, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// runShares runs each share: the first in this process when there is
// only one, else each in a worker process (bin, with workerEnv set),
// all at once. dir holds the shares' files.
func runShares(ctx context.Context, bin, dir string, shares []Share) ([]ShareResult, error) {
	if len(shares) == 1 {
		r, err := shares[0].Run(ctx)
		return []ShareResult{r}, err
	}
	out := make([]ShareResult, len(shares))
	errs := make(chan error, len(shares))
	for i, s := range shares {
		go func() {
			path := fmt.Sprintf("%s/share-%02d.json", dir, i)
			b, _ := json.Marshal(s)
			if err := os.WriteFile(path, b, 0o600); err != nil {
				errs <- err
				return
			}
			cmd := exec.CommandContext(ctx, bin, "-test.run=^$")
			cmd.Env = append(os.Environ(), workerEnv+"="+path)
			cmd.SysProcAttr = childAttr()
			if b, err := cmd.CombinedOutput(); err != nil {
				errs <- fmt.Errorf("simulator worker %d: %v\n%s", i, err, b)
				return
			}
			b, err := os.ReadFile(path + ".out")
			if err == nil {
				err = json.Unmarshal(b, &out[i])
			}
			errs <- err
		}()
	}
	var first error
	for range shares {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return out, first
}
