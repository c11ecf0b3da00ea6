package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	fleetrun "github.com/devicegate/devicegate/fleet" // forward_process_test.go has a fleet of its own
	"github.com/devicegate/devicegate/simulator"
)

// simulate runs a simulated fleet against a gateway (package fleet
// starts it and runs the simulator) until the run ends or ctx is
// cancelled, prints the summary and judges it.
func simulate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sim, err := fleetrun.ParseSimulate(args)
	if errors.Is(err, flag.ErrHelp) {
		printSimulateUsage(stdout, simulateFlagSet())
		return err
	}
	if err != nil {
		return asUsage(err)
	}
	sim.Warn = func(msg string) { fmt.Fprintf(stderr, "gateway: simulate: warning: %s\n", msg) }
	if isTerminal(stdout) && sim.JSON != "-" {
		sim.Config.Progress = simulator.ProgressLine(stdout)
	}
	out, err := sim.Run(ctx)
	if sim.Config.Progress != nil {
		fmt.Fprint(stdout, "\r\033[K")
	}
	if out != nil && out.Spawned != nil && sim.JSON != "-" {
		u := out.Spawned
		fmt.Fprintf(stdout, "spawned gateway process: peak RSS %.1f MiB (%.1f KB per device), CPU %s\n",
			float64(u.MaxRSS)/(1<<20), float64(u.MaxRSS)/1024/float64(max(sim.Config.Devices, 1)), u.CPU.Round(time.Millisecond))
	}
	if err != nil {
		return asUsage(err)
	}
	return simulateOutput(ctx, out.Report, sim, stdout, stderr)
}

// asUsage makes package fleet's usage errors this command's (exit 2).
func asUsage(err error) error {
	var u *fleetrun.UsageError
	if errors.As(err, &u) {
		return usageError{err}
	}
	return err
}

func printSimulateUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `Usage: gateway simulate [flags]

Connects --devices simulated devices to a gateway: a running one at
--addr, one in this process (--embedded), or a child process (--spawn);
publishes for --duration, then waits for messages still in flight. A
subscriber on the devices' topics sees what the gateway let through,
and the checker judges every device against its quota (--limit/--window,
or its class of --mix). Faults: --storm-at, --restart-at (--restart
sigterm|kill), --clock-step. Prints a summary (and a progress line on a
terminal); --json and --report write the details. A gateway with
authentication on: --username and --password-file (or
$GATEWAY_SIM_PASSWORD) for the devices, --sub-username and
--sub-password-file for the subscriber, --tls-ca for TLS. Exits 0 when
no device exceeded its quota, nothing was lost, leaked or made up and
no device was refused at CONNECT, 1 otherwise, naming the worst devices. SIGINT or SIGTERM ends publishing early and
reports what was seen.

Flags:
`)
	printFlags(w, fs)
}

// simulateOutput writes the summary, JSON and HTML reports, and turns
// the verdict into an error.
func simulateOutput(ctx context.Context, rep *simulator.Report, sim *fleetrun.Simulation, stdout, stderr io.Writer) error {
	if sim.JSON != "-" {
		if err := rep.WriteSummary(stdout); err != nil {
			return err
		}
	}
	if sim.JSON != "" {
		if err := rep.SaveJSON(sim.JSON, stdout); err != nil {
			return fmt.Errorf("simulate: --json: %w", err)
		}
	}
	if sim.Report != "" {
		if err := rep.SaveHTML(sim.Report); err != nil {
			return fmt.Errorf("simulate: --report: %w", err)
		}
	}
	for _, e := range rep.Errors {
		fmt.Fprintf(stderr, "gateway: simulate: %s\n", e)
	}
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "gateway: simulate: interrupted; the report covers the run so far")
	}
	if rep.Verdict.OK {
		return nil
	}
	if rep.RefusedAtConnect > 0 {
		return fmt.Errorf("simulate: FAIL: the gateway refused %d of %d devices at CONNECT (see above); check --username, --password-file or $%s, and the account's client IDs (--id-pattern)",
			rep.RefusedAtConnect, rep.Config.Devices, fleetrun.SimPasswordEnv)
	}
	if hint := rep.LostHint(!sim.Own); hint != "" {
		fmt.Fprintf(stderr, "gateway: simulate: %s\n", hint)
	}
	if len(rep.Verdict.Worst) > 0 {
		return fmt.Errorf("simulate: FAIL: worst devices: %s", strings.Join(rep.Verdict.Worst, ", "))
	}
	return errors.New("simulate: FAIL: the subscriber lost its connection, so arrivals could not all be seen")
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	file, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := file.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// simulateFlagSet is the simulate command's flags, for its help.
func simulateFlagSet() *flag.FlagSet { return fleetrun.SimulateFlagSet() }
