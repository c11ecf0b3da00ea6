#!/usr/bin/env bash
# owner-cost.sh measures what owner mode (cluster.decisions: owner, the
# default in cluster mode) costs a gateway per message: a standalone
# gateway and an owner-mode gateway (its own redis-server on loopback)
# side by side, each with the same fleet from a simulator process of its
# own, at once; per round it prints each gateway's CPU per decided
# publish over a steady interval (after SETTLE, for MEASURE) and their
# ratio. The fleet is the fleet harness's load per gateway (make fleet
# with FLEET_DEVICES=12000 on six gateways): DEVICES (2000) at RATE
# (0.1/s) for DURATION (90s), LIMIT (5) per WINDOW (10s). ROUNDS (1)
# repeats the pair; the gateways keep running between rounds.
# Usage: scripts/owner-cost.sh OUTDIR (needs ./gateway: make build, or
# GATEWAY=path of another build; and redis-server).
set -euo pipefail

out=${1:-owner-cost-out}
gateway=${GATEWAY:-./gateway}
devices=${DEVICES:-2000}
rate=${RATE:-0.1/s}
duration=${DURATION:-90s}
settle=${SETTLE:-25}
measure=${MEASURE:-50}
limit=${LIMIT:-5}
window=${WINDOW:-10s}
rounds=${ROUNDS:-1}
token=owner-cost-token
rm -rf "$out" && mkdir -p "$out"
ulimit -n "$(ulimit -Hn)"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no >"$out/redis.log" 2>&1 &
pids+=($!)
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.1; done

declare -A mqtt admin gwpid
for g in alone owner; do
	dir=$out/$g
	mkdir -p "$dir"
	printf 'mqtt:\n  consumers: {client_ids: ["simulator-sub-*"]}\nlimits:\n  default: {limit: %s, window: %s}\n' "$limit" "$window" >"$dir/gateway.yaml"
	if [ "$g" = owner ]; then
		printf 'cluster:\n  redis: {addrs: ["127.0.0.1:%s"]}\n  failure_policy: local\n' "$redis_port" >>"$dir/gateway.yaml"
	fi
	mqtt[$g]=127.0.0.1:$(free_port)
	admin[$g]=127.0.0.1:$(free_port)
	GATEWAY_ADMIN_TOKEN=$token "$gateway" serve --config "$dir/gateway.yaml" --mqtt-addr "${mqtt[$g]}" \
		--admin-addr "${admin[$g]}" --data-dir "$dir/data" --log-level warn 2>"$dir/gateway.log" &
	gwpid[$g]=$!
	pids+=($!)
done
for g in alone owner; do
	until curl -fsS -o /dev/null -H "Authorization: Bearer $token" "http://${admin[$g]}/metrics" 2>/dev/null; do sleep 0.1; done
done

# cpu G: the gateway's user and system CPU seconds so far (clock ticks
# in /proc/PID/stat fields 14 and 15); decided G: its publishes decided.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14+$15)/hz}' "/proc/${gwpid[$1]}/stat"; }
decided() {
	curl -fsS -H "Authorization: Bearer $token" "http://${admin[$1]}/metrics" |
		awk '$1 ~ /^devicegate_publishes_total/ {s+=$2} END {printf "%d", s}'
}

for r in $(seq "$rounds"); do
	sims=()
	for g in alone owner; do
		"$gateway" simulate --addr "${mqtt[$g]}" --devices "$devices" --rate "$rate" --duration "$duration" \
			--ramp-up 200 --drain 5s --limit "$limit" --window "$window" --client lean \
			--id-pattern "$g-$r-%06d" >"$out/$g/sim-$r.txt" 2>&1 &
		sims+=($!)
	done
	sleep "$settle"
	declare -A c0 d0
	for g in alone owner; do c0[$g]=$(cpu $g); d0[$g]=$(decided $g); done
	sleep "$measure"
	line="round $r:"
	declare -A per
	for g in alone owner; do
		c=$(cpu $g)
		d=$(decided $g)
		per[$g]=$(awk -v c="$c" -v c0="${c0[$g]}" -v d="$d" -v d0="${d0[$g]}" 'BEGIN {printf "%.1f", (c-c0)/(d-d0)*1e6}')
		line="$line $g $(awk -v c="$c" -v c0="${c0[$g]}" 'BEGIN {printf "%.2f", c-c0}') s for $((d - ${d0[$g]})) decided, ${per[$g]} us/msg;"
	done
	wait "${sims[@]}"
	echo "$line owner / standalone $(awk -v a="${per[owner]}" -v b="${per[alone]}" 'BEGIN {printf "%.2f", a/b}')x"
done
