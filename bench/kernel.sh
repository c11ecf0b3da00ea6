#!/usr/bin/env bash
# kernel.sh counts what a server asks of the kernel per message under
# bench/loadgen, with perf's software events and system call
# tracepoints: its user and system CPU, its context switches and its
# system calls by name (read, write, futex, epoll_pwait, nanosleep, ...),
# for this build's gateway, plain mochi (bench/plainmochi) and, given
# BASE (a gateway binary), another build's gateway. It is the part of a
# server's CPU that bench/instructions.sh does not count: instructions
# are user space only, and a wake-up or a system call costs the same
# whatever the instructions around it.
#
#	bench/kernel.sh                 # QoS 0
#	QOS=1 bench/kernel.sh
#	ROUNDS=3 QOS=1 bench/kernel.sh  # medians of 3 rounds
#
# Counted only while loadgen publishes (loadgen -wait-signal). CPU time
# and context switches move with the machine's load; system calls per
# message move with how many messages a read carries, which moves with
# the load too: run it on a quiet machine, and compare the targets of
# one run. Needs perf (linux-perf) and root or
# kernel.perf_event_paranoid <= -1 for the tracepoints.
set -euo pipefail
QOS=${QOS:-0}
DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-1}
command -v perf >/dev/null || { echo "kernel: perf not found (apt-get install -y linux-perf)" >&2; exit 1; }
# shellcheck source=bench/targets.sh
. "$(dirname "$0")/targets.sh"
build_targets

calls=(read write writev epoll_pwait futex nanosleep sched_yield getpid tgkill rt_sigreturn madvise mmap pwrite64 fdatasync)
events=task-clock,context-switches,cpu-migrations
for c in "${calls[@]}"; do
	events+=",syscalls:sys_enter_$c"
done
hz=$(getconf CLK_TCK)

# measure NAME BIN ROUND: runs BIN with loadgen against it and appends
# one line per counter to $work/counts: target, round, counter, per message.
measure() {
	local name=$1 bin=$2 round=$3 dir="$work/run-$1-$3"
	start_target "$name" "$bin" "$dir"
	start_load "$name" "$dir"
	# perf starts with its counters off (-D -1) and switches them on and
	# off when told through a FIFO, acknowledging on another: counted
	# is loadgen's publishing alone.
	mkfifo "$dir/ctl" "$dir/ack"
	perf stat -x, -D -1 --control "fifo:$dir/ctl,$dir/ack" -e "$events" -p "$pid" -o "$dir/perf" 2>"$dir/perf.log" &
	local perf=$! before after m
	pids+=("$perf")
	exec 7<>"$dir/ctl" 8<>"$dir/ack"
	echo enable >&7
	read -r -t 30 -u 8 _ || { echo "kernel: perf did not start counting" >&2; exit 1; }
	before=$(awk '{print $14, $15}' "/proc/$pid/stat")
	kill -USR1 "$lg"
	wait "$lg"
	echo disable >&7
	read -r -t 30 -u 8 _ || { echo "kernel: perf did not stop counting" >&2; exit 1; }
	after=$(awk '{print $14, $15}' "/proc/$pid/stat")
	kill -INT "$perf"
	wait "$perf" || true
	exec 7>&- 8>&-
	kill "$pid"
	wait "$pid" 2>/dev/null || true
	m=$(published "$dir")
	[ "${m:-0}" -gt 0 ] || { echo "kernel: loadgen published nothing against $name" >&2; exit 1; }
	# CPU from /proc (clock ticks), the rest from perf's CSV
	# (value,unit,event,...).
	awk -v t="$name" -v r="$round" -v m="$m" -v hz="$hz" -v b="$before" -v a="$after" 'BEGIN {
		split(b, B, " "); split(a, A, " ")
		printf "%s %s user_us %.3f\n", t, r, 1e6 * (A[1] - B[1]) / hz / m
		printf "%s %s system_us %.3f\n", t, r, 1e6 * (A[2] - B[2]) / hz / m
	}' >>"$work/counts"
	awk -F, -v t="$name" -v r="$round" -v m="$m" '$3 != "" && $1 ~ /^[0-9.]+$/ {
		e = $3; sub(/^syscalls:sys_enter_/, "", e)
		if (e == "task-clock") printf "%s %s task_clock_us %.3f\n", t, r, 1000 * $1 / m
		else printf "%s %s %s %.4f\n", t, r, e, $1 / m
	}' "$dir/perf" >>"$work/counts"
}

targets=(gateway mochi)
[ -n "${BASE:-}" ] && cp "$BASE" "$work/base" && targets+=(base)
for r in $(seq "$ROUNDS"); do
	for t in "${targets[@]}"; do
		case $t in
		gateway) measure gateway "$work/gateway" "$r" ;;
		mochi) measure mochi mochi "$r" ;;
		base) measure base "$work/base" "$r" ;;
		esac
	done
done

echo "per published message, QoS $QOS, loadgen -duration $DURATION (50 publishers, 5 subscribers), median of $ROUNDS round(s); load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$work/counts" "${targets[@]}" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
targets = sys.argv[2:]
vals, order = {}, []
for t, r, k, v in rows:
    vals.setdefault((k, t), []).append(float(v))
    if k not in order:
        order.append(k)
print("%-20s" % "counter" + "".join("%12s" % t for t in targets) + "  %s / %s" % (targets[0], targets[1]))
for k in order:
    med = [statistics.median(vals.get((k, t), [0])) for t in targets]
    ratio = "%8.2f" % (med[0] / med[1]) if med[1] else "%8s" % "-"
    print("%-20s" % k + "".join("%12.4g" % x for x in med) + ratio)
PY
