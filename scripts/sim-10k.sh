#!/usr/bin/env bash
# sim-10k.sh runs 10,000 simulated devices at 0.2 messages/s each for
# 60 s against a separate gateway process on this machine, and prints
# the CPU time and peak memory (GNU time) of the gateway and of the
# simulator. Usage: scripts/sim-10k.sh OUTDIR (needs ./gateway: make build).
# DEVICES, RATE, DURATION and SIM_ARGS change the simulator's side,
# GATEWAY_ARGS (e.g. "--config file") the gateway's.
set -euo pipefail

out=${1:-sim-out}
devices=${DEVICES:-10000}
rate=${RATE:-0.2/s}
duration=${DURATION:-60s}
mkdir -p "$out"
rm -rf "$out/10k-data"
TIME=/usr/bin/time
[ -x "$TIME" ] || { echo "sim-10k: $TIME is missing (Debian package time)" >&2; exit 1; }

# Each side holds one socket per device: raise the soft limit on open
# files to the hard one (the simulator also does it for itself).
ulimit -n "$(ulimit -Hn)"

# The simulator's subscriber takes every device's messages: the gateway
# names it a backend consumer (README, Sizing), else beyond its
# 64-message queue what it cannot take at once is dropped (and counted
# lost here). A --config in GATEWAY_ARGS replaces this file: name the
# subscriber there.
printf 'mqtt:\n  consumers: {client_ids: ["simulator-sub-*"]}\n' >"$out/10k-gateway.yaml"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$TIME" -v -o "$out/10k-gateway.time" ./gateway serve --mqtt-addr "127.0.0.1:$port" --admin-addr 127.0.0.1:0 \
	--data-dir "$out/10k-data" --limit 5 --window 10s --log-level warn --config "$out/10k-gateway.yaml" ${GATEWAY_ARGS:-} 2>"$out/10k-gateway.log" &
timepid=$!
gwpid=""
for _ in $(seq 100); do
	gwpid=$(pgrep -P "$timepid" || true)
	[ -n "$gwpid" ] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
	sleep 0.1
done
[ -n "$gwpid" ] || { echo "sim-10k: the gateway did not start" >&2; cat "$out/10k-gateway.log" >&2; exit 1; }
trap 'kill -TERM "$gwpid" 2>/dev/null || true' EXIT

status=0
"$TIME" -v -o "$out/10k-simulator.time" ./gateway simulate --addr "127.0.0.1:$port" --devices "$devices" \
	--rate "$rate" --duration "$duration" --ramp-up 500 --drain 10s --limit 5 --window 10s ${SIM_ARGS:-} \
	--json "$out/10k.json" --report "$out/10k.html" || status=$?
kill -TERM "$gwpid"
wait "$timepid" || true
trap - EXIT

for side in gateway simulator; do
	echo "== $side"
	grep -E 'User time|System time|Elapsed|Maximum resident' "$out/10k-$side.time"
done
exit "$status"
