package fleet

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// CommandsPerAdmitted is Redis's commands (INFO commandstats, those of
// scripts included) per message the gateways admitted in the phase.
func (p Phase) CommandsPerAdmitted() float64 {
	if p.Totals.Accepted == 0 {
		return 0
	}
	return float64(p.Redis.Commands) / float64(p.Totals.Accepted)
}

// WindowBound is the most a device may be admitted in any window of T
// in the phase: N when every decision was made in Redis, else the
// failure policy local's bound through the gateways, (k+1) x N
// (docs/operations.md, "When Redis is unreachable").
func (p Phase) WindowBound(gateways int) int {
	if p.Fallbacks == 0 {
		return p.Limit
	}
	return (gateways + 1) * p.Limit
}

// CPUPerMessage is the gateways' CPU time per message acknowledged
// (admitted or refused), over the gateways of the phase; and the
// standalone gateway's, 0 without one.
func (p Phase) CPUPerMessage() (cluster, standalone time.Duration) {
	var cpu time.Duration
	for _, c := range p.GatewayCPU {
		cpu += c
	}
	if p.Totals.Acked > 0 {
		cluster = cpu / time.Duration(p.Totals.Acked)
	}
	if p.StandaloneTotals.Acked > 0 {
		standalone = p.StandaloneCPU / time.Duration(p.StandaloneTotals.Acked)
	}
	return cluster, standalone
}

// Write prints the report as text: the form docs/benchmarks.md keeps.
func (r *Report) Write(w io.Writer) {
	s := r.Spec
	redis := "one redis-server"
	if s.RedisMasters > 0 {
		redis = fmt.Sprintf("Redis Cluster, %d masters x %d replicas", s.RedisMasters, s.RedisReplicas)
	}
	front := "devices hold the gateways' list (next on failure)"
	if s.HAProxy != "" {
		front = "HAProxy in front (" + strings.TrimPrefix(strings.SplitN(s.HAProxy, "\n", 2)[0], "# devicegate: ") + ")"
	}
	fmt.Fprintf(w, "fleet: %d gateways, %s, %s; quota %d/%s drop; open-file limit %d, at most %d devices per simulator process\n",
		s.Gateways, redis, front, s.Quota.Limit, s.Quota.Window, r.FileLimit, s.PerProcess)
	for i, p := range r.Phases {
		fmt.Fprintf(w, "\nphase %q: %d devices in %d simulator processes, %s wall\n", p.Name, p.Devices, p.Shares, p.Wall.Round(time.Millisecond))
		t := p.Totals
		fmt.Fprintf(w, "  messages: sent %d, acked %d, admitted %d, refused %d, lost %d, unacked %d\n", t.Sent, t.Acked, t.Accepted, t.Refused, t.Lost, t.Unacked)
		fmt.Fprintf(w, "  window check: worst count in any window %d against N = %d (bound %d); %d devices over quota; %.0f decisions by the failure policy\n",
			p.WorstWindow, p.Limit, p.WindowBound(s.Gateways), p.Violations, p.Fallbacks)
		connected := p.AllConnected.Round(time.Millisecond).String()
		if p.AllConnected == 0 {
			connected = "never all at once"
		}
		fmt.Fprintf(w, "  time to connect every device: %s (%d never connected); PUBACK p50 %s, p99 %s\n", connected, p.ConnectFailures,
			p.PubackP50.Round(10*time.Microsecond), p.PubackP99.Round(10*time.Microsecond))
		var rss []string
		var total int64
		for i, b := range p.GatewayRSS {
			rss = append(rss, fmt.Sprintf("%.0f", float64(b)/(1<<20)))
			if b == 0 {
				rss[i] = "killed"
			}
			total += b
		}
		perDev := 0.0
		if p.Devices > 0 {
			perDev = float64(total) / 1024 / float64(p.Devices)
		}
		fmt.Fprintf(w, "  gateway RSS MiB: %s (%.1f KiB per device over all gateways)\n", strings.Join(rss, ", "), perDev)
		cl, al := p.CPUPerMessage()
		fmt.Fprintf(w, "  gateway CPU per message: %s in the cluster", cl.Round(100*time.Nanosecond))
		if al > 0 {
			fmt.Fprintf(w, ", %s standalone at the same per-gateway load (%d devices, %.1f MiB RSS): %.2fx", al.Round(100*time.Nanosecond),
				p.StandaloneDevices, float64(p.StandaloneRSS)/(1<<20), float64(cl)/float64(al))
		}
		fmt.Fprintln(w)
		if sent := t.Sent + p.StandaloneTotals.Sent; p.SimulatorCPU > 0 && sent > 0 {
			fmt.Fprintf(w, "  simulator CPU: %s, %s per message sent (standalone's share included)\n",
				p.SimulatorCPU.Round(time.Millisecond), (p.SimulatorCPU / time.Duration(sent)).Round(100*time.Nanosecond))
		}
		perMsg := time.Duration(0)
		if t.Accepted > 0 {
			perMsg = p.Redis.CPU / time.Duration(t.Accepted)
		}
		fmt.Fprintf(w, "  Redis: %d commands, %.3f per admitted message; CPU %s, %s per admitted message\n", p.Redis.Commands, p.CommandsPerAdmitted(),
			p.Redis.CPU.Round(time.Millisecond), perMsg.Round(100*time.Nanosecond))
		fmt.Fprintf(w, "  Redis commands most called: %s\n", strings.Join(p.Redis.Top(6), ", "))
		if i == 1 && len(s.TenantGroup) > 0 {
			var ws []string
			for _, l := range s.TenantGroup {
				ws = append(ws, l.String())
			}
			perMsg := 0.0
			if t.Accepted > 0 {
				perMsg = p.GrantClaims / float64(t.Accepted)
			}
			fmt.Fprintf(w, "  tenant group %q (%s): %.0f grant claims, %.4f per admitted message; %.0f messages granted\n",
				TenantGroupName, strings.Join(ws, ", "), p.GrantClaims, perMsg, p.GrantMessages)
		}
		p.Steady.write(w)
		if n := len(p.Failovers); n > 0 {
			fmt.Fprintf(w, "  connections lost and admitted again elsewhere: %d; from the loss seen by the device p50 %s, p95 %s, max %s\n", n,
				p.Failovers.Quantile(0.5).Round(time.Millisecond), p.Failovers.Quantile(0.95).Round(time.Millisecond), p.Failovers.Quantile(1).Round(time.Millisecond))
		}
		if i == 0 && !r.GatewayKilled.IsZero() {
			fmt.Fprintf(w, "  gateway killed (SIGKILL) at %s: 95%% of its moved devices admitted again %s after the kill, all %s after\n",
				r.GatewayKilled.Sub(r.Phase1Started).Round(time.Millisecond), p.SinceKill(r.GatewayKilled, 0.95).Round(time.Millisecond), p.SinceKill(r.GatewayKilled, 1).Round(time.Millisecond))
		}
		if i == 1 && !r.RedisKilled.IsZero() {
			fmt.Fprintf(w, "  redis server %s killed (SIGKILL) %s into the phase", r.RedisKilledAddr, r.RedisKilled.Sub(r.Phase2Started).Round(time.Millisecond))
			if r.RedisClusterOK > 0 {
				fmt.Fprintf(w, "; the Cluster served every slot again %s later", r.RedisClusterOK.Round(10*time.Millisecond))
			}
			fmt.Fprintln(w)
		}
		for _, e := range p.Errors[:min(len(p.Errors), 5)] {
			fmt.Fprintf(w, "  note: %s\n", e)
		}
	}
}
