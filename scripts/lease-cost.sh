#!/usr/bin/env bash
# lease-cost.sh measures what crash leases cost: the same fleet against a
# gateway with persist.after_crash: charge (leases) and forgive (no
# leases), back to back and in both orders (charge, forgive, forgive,
# charge), each a separate gateway process on a fresh data directory.
# Per run it prints the publishes decided, the lease transactions and
# records written (devicegate_lease_writes_total,
# devicegate_lease_records_total), the publishes that waited for a
# lease write (devicegate_lease_waits_total), the snapshots, the
# delivery latency p50/p99 the simulator measured (publish to its
# subscriber, the p99 of make sim-10k's table), the PUBACK p99 once
# every device was connected, the first connections' CONNACK latency
# p50/p99, and the gateway's user and system CPU;
# then, side by side, charge over forgive (the two runs of each added):
# the gateway's CPU, the delivery p99 (the runs' mean; also of all the
# runs' messages together, and the PUBACK p99 once every device was
# connected, the ramp left out) and the publishes decided, and the
# lease records and transactions per second with charge.
# Usage: scripts/lease-cost.sh OUTDIR (needs ./gateway: make build, or
# GATEWAY=path of another build).
# The fleet is make sim-10k's: DEVICES (10000), RATE (0.2/s), DURATION
# (60s), LIMIT (5), WINDOW (10s): a lease of 1 message, the dearest;
# PATTERN (steady) is the simulator's --pattern (poisson: each device's
# gaps at random, so devices that connected together do not publish
# together).
# ROUNDS (1) repeats the four runs; the summary then also gives each
# setting's median p99 and the median of the rounds' p99 ratios, steadier
# than the mean when one run meets a stall of the machine.
# WARMUP (1) runs first that many runs of the same fleet with charge,
# printed as warmup and counted in no comparison: on the 2-core VMs
# measured, the first run of a series ran slower than the rest (the
# median delivery p99 of its half seconds after the ramp two to three
# times the others' in two series of five one evening, and in one the
# day before), and it was always a charge run.
set -euo pipefail

out=${1:-lease-out}
gateway=${GATEWAY:-./gateway}
devices=${DEVICES:-10000}
rate=${RATE:-0.2/s}
duration=${DURATION:-60s}
limit=${LIMIT:-5}
window=${WINDOW:-10s}
pattern=${PATTERN:-steady}
rounds=${ROUNDS:-1}
warmup=${WARMUP:-1}
mkdir -p "$out"
ulimit -n "$(ulimit -Hn)"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
metric() { awk -v m="$1" '$1==m {printf "%d", $2; found=1} END {if (!found) printf "0"}' "$2"; }

run() { # run NAME AFTER_CRASH
	local name=$1 mode=$2 dir="$out/$1"
	rm -rf "$dir" && mkdir -p "$dir"
	printf 'persist:\n  after_crash: %s\nmqtt:\n  consumers: {client_ids: ["simulator-sub-*"]}\n' "$mode" >"$dir/gateway.yaml"
	local port admin token=lease-cost-token
	port=$(free_port)
	admin=$(free_port)
	GATEWAY_ADMIN_TOKEN=$token "$gateway" serve --config "$dir/gateway.yaml" --mqtt-addr "127.0.0.1:$port" \
		--admin-addr "127.0.0.1:$admin" --data-dir "$dir/data" --limit "$limit" --window "$window" \
		--log-level warn 2>"$dir/gateway.log" &
	local gw=$!
	for _ in $(seq 100); do
		curl -fsS -o /dev/null -H "Authorization: Bearer $token" "http://127.0.0.1:$admin/metrics" 2>/dev/null && break
		sleep 0.1
	done
	curl -fsS -H "Authorization: Bearer $token" "http://127.0.0.1:$admin/metrics" >"$dir/metrics.before"
	local status=0
	"$gateway" simulate --addr "127.0.0.1:$port" --devices "$devices" --rate "$rate" --duration "$duration" \
		--ramp-up 500 --drain 10s --limit "$limit" --window "$window" --pattern "$pattern" --client lean \
		--json "$dir/sim.json" >"$dir/sim.txt" 2>&1 || status=$?
	curl -fsS -H "Authorization: Bearer $token" "http://127.0.0.1:$admin/metrics" >"$dir/metrics.after"
	# The gateway's user and system CPU so far (clock ticks in
	# /proc/PID/stat fields 14 and 15), before its shutdown.
	local cpu cpusec
	cpu=$(awk -v hz="$(getconf CLK_TCK)" '{printf "CPU %.1f + %.1f = %.1f s", $14/hz, $15/hz, ($14+$15)/hz}' "/proc/$gw/stat")
	cpusec=$(awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14+$15)/hz}' "/proc/$gw/stat")
	kill -TERM "$gw"
	wait "$gw" || true
	local b=$dir/metrics.before a=$dir/metrics.after
	local decided=0 writes records waits p99
	decided=$(awk '$1 ~ /^devicegate_publishes_total/ {s+=$2} END {printf "%d", s}' "$a")
	writes=$(($(metric devicegate_lease_writes_total "$a") - $(metric devicegate_lease_writes_total "$b")))
	records=$(($(metric devicegate_lease_records_total "$a") - $(metric devicegate_lease_records_total "$b")))
	waits=$(($(metric devicegate_lease_waits_total "$a") - $(metric devicegate_lease_waits_total "$b")))
	p99=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["result"]["totals"]["latency_p99_ns"]/1e6)' "$dir/sim.json" 2>/dev/null || echo nan)
	p99c=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("puback_connected", {}).get("latency_p99_ns", 0)/1e6)' "$dir/sim.json" 2>/dev/null || echo nan)
	printf '%-8s %-8s decided %8s  lease writes %6s  lease records %7s  publishes that waited for a lease %6s  snapshots %4s  gateway %s  %s  (simulator exit %s)\n' \
		"$name" "$mode" "$decided" "$writes" "$records" "$waits" \
		$(($(metric devicegate_snapshots_total "$a") - $(metric devicegate_snapshots_total "$b"))) \
		"$cpu" \
		"$(python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["result"]["totals"]; r=json.load(open(sys.argv[1])); c=r.get("connect", {}); s=r.get("puback_connected", {}); print("sent %d acked %d delivery p50 %.1f ms p99 %.1f ms (PUBACK p99 once all connected %.1f ms)  CONNACK p50 %.1f ms p99 %.1f ms" % (t["sent"], t["acked"], t["latency_p50_ns"]/1e6, t["latency_p99_ns"]/1e6, s.get("latency_p99_ns", 0)/1e6, c.get("latency_p50_ns", 0)/1e6, c.get("latency_p99_ns", 0)/1e6))' "$dir/sim.json" 2>/dev/null || grep -E '^ +[0-9]' "$dir/sim.txt" | head -1)" \
		"$status"
	# mode, CPU seconds, p99 ms, decided, lease writes, lease records,
	# p99 once every device was connected: for the summary.
	printf '%s %s %s %s %s %s %s\n' "$mode" "$cpusec" "$p99" "$decided" "$writes" "$records" "$p99c" >>"$out/runs"
}

# summary prints charge over forgive from $out/runs (the runs of each
# setting added up) and the lease records and transactions per second.
summary() {
	awk -v secs="$(python3 -c 'import sys,re; m=re.fullmatch(r"([0-9.]+)(ms|s|m|h)", sys.argv[1]); print(float(m[1])*{"ms":0.001,"s":1,"m":60,"h":3600}[m[2]])' "$duration")" '
	{ n[$1]++; cpu[$1]+=$2; p99[$1]+=$3; dec[$1]+=$4; w[$1]+=$5; r[$1]+=$6 }
	END {
		if (!n["charge"] || !n["forgive"] || !cpu["forgive"] || !p99["forgive"] || !dec["forgive"]) { print "lease-cost: no comparison (a run failed)"; exit 1 }
		printf "charge / forgive: gateway CPU %.1f s / %.1f s = %.2fx  delivery p99 (mean of runs) %.1f ms / %.1f ms = %.2fx  decided %d / %d = %.3fx\n",
			cpu["charge"]/n["charge"], cpu["forgive"]/n["forgive"], (cpu["charge"]/n["charge"])/(cpu["forgive"]/n["forgive"]),
			p99["charge"]/n["charge"], p99["forgive"]/n["forgive"], (p99["charge"]/n["charge"])/(p99["forgive"]/n["forgive"]),
			dec["charge"]/n["charge"], dec["forgive"]/n["forgive"], (dec["charge"]/n["charge"])/(dec["forgive"]/n["forgive"])
		printf "charge / forgive: gateway CPU per decided publish %.1f us / %.1f us = %.2fx (the runs decided as many unless the machine was saturated)\n",
			1e6*cpu["charge"]/dec["charge"], 1e6*cpu["forgive"]/dec["forgive"], (cpu["charge"]/dec["charge"])/(cpu["forgive"]/dec["forgive"])
		printf "charge: lease records %.0f per second, lease transactions %.1f per second (of %s s runs)\n",
			r["charge"]/n["charge"]/secs, w["charge"]/n["charge"]/secs, secs
	}' "$out/runs"
	python3 - "$out/runs" <<'PY'
import statistics, sys
runs = [l.split() for l in open(sys.argv[1])]
p99 = {"charge": [], "forgive": []}
for r in runs:
    p99[r[0]].append(float(r[2]))
if len(runs) >= 8:
    # Each round is charge, forgive, forgive, charge: its ratio is the
    # sum of its two charge p99s over its two forgive p99s.
    ratios = [(float(runs[i][2]) + float(runs[i + 3][2])) / (float(runs[i + 1][2]) + float(runs[i + 2][2]))
              for i in range(0, len(runs) - 3, 4)]
    print("charge / forgive over %d rounds: delivery p99 median %.1f ms / %.1f ms = %.2fx; per round %s, median %.2fx" % (
        len(ratios), statistics.median(p99["charge"]), statistics.median(p99["forgive"]),
        statistics.median(p99["charge"]) / statistics.median(p99["forgive"]),
        " ".join("%.2fx" % x for x in ratios), statistics.median(ratios)))
# The p99 of all the runs' messages of each setting together (their
# latency histograms added): a stall in one run weighs by the messages
# it delayed, not by the run's whole p99.
import json, os
hist = {"charge": {}, "forgive": {}}
per = None
for i, r in enumerate(runs):
    try:
        h = json.load(open(os.path.join(os.path.dirname(sys.argv[1]), str(i + 1), "sim.json")))["result"]["totals"]["latency_hist"]
    except (OSError, KeyError, ValueError):
        hist = None
        break
    per = (h["base_ns"], h["per_doubling"])
    for idx, n in h["buckets"]:
        hist[r[0]][idx] = hist[r[0]].get(idx, 0) + n
def pooled(h, q):
    total, seen = sum(h.values()), 0
    for idx in sorted(h):
        seen += h[idx]
        if seen * 100 >= total * q:
            return per[0] * 2 ** ((idx + 1) / per[1]) / 1e6
if hist and hist["charge"] and hist["forgive"]:
    c, f = pooled(hist["charge"], 99), pooled(hist["forgive"], 99)
    print("charge / forgive, delivery p99 of all runs' messages together: %.1f ms / %.1f ms = %.2fx (p50 %.2f ms / %.2f ms)" % (
        c, f, c / f, pooled(hist["charge"], 50), pooled(hist["forgive"], 50)))
after = {"charge": [], "forgive": []}
for r in runs:
    if len(r) > 6:
        after[r[0]].append(float(r[6]))
if after["charge"] and after["forgive"] and sum(after["forgive"]) > 0:
    print("charge / forgive, PUBACK p99 once every device was connected (the ramp's connections left out): %.1f ms / %.1f ms = %.2fx" % (
        statistics.mean(after["charge"]), statistics.mean(after["forgive"]), statistics.mean(after["charge"]) / statistics.mean(after["forgive"])))
PY
}

echo "lease-cost: $devices devices at $rate ($pattern) for $duration, quota $limit per $window, QoS 1; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for w in $(seq "$warmup"); do
	run "warmup$w" charge
done
rm -f "$out/runs"
for r in $(seq "$rounds"); do
	b=$(((r - 1) * 4))
	run $((b + 1)) charge
	run $((b + 2)) forgive
	run $((b + 3)) forgive
	run $((b + 4)) charge
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
summary
