// Package fleet orchestrates the processes a simulated run needs: the
// gateway a `gateway simulate` run targets (in this process, a child
// process, or one already running), the upstream it forwards to, and
// the fleet harness, several gateway processes in cluster mode sharing
// a redis-server or a Redis Cluster, optionally behind HAProxy, with the
// simulator split over as many processes as the open-file limit needs.
//
// ParseSimulate reads the simulate command's flags into a Simulation,
// whose Run starts what the flags ask for, runs the simulator
// (package simulator) and stops it again; cmd/gateway prints the
// report.
//
// Run (the harness) takes a Spec: StartRedis, StartGateways and
// StartHAProxy start the servers; Shares of the fleet run in this
// process or in worker processes (the test binary again); around each
// phase the gateways' CPU time and memory (/proc) and Redis's INFO
// commandstats and cpu are read, and faults (a gateway or a Redis server
// killed with SIGKILL) are injected at their offsets. Report.Write
// prints what docs/benchmarks.md keeps. Every process is started with
// Pdeathsig set, on loopback addresses, and stopped by its PID.
package fleet
