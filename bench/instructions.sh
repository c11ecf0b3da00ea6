#!/usr/bin/env bash
# instructions.sh counts the instructions a server executes per message
# under bench/loadgen, with valgrind's callgrind, for this build's
# gateway, plain mochi (bench/plainmochi) and, given BASE (a gateway
# binary), another build's gateway; and prints, per target, the
# instructions per published message in all and by part (mochi's hook
# dispatch, the gateway's hooks, the quota table, the garbage collector,
# ...). An instruction count is the same whatever else runs on the
# machine, where CPU time per message moves by a quarter between
# rounds on a busy one (docs/benchmarks.md).
#
#	bench/instructions.sh                      # QoS 0, this build and plain mochi
#	QOS=1 bench/instructions.sh
#	BASE=/tmp/gateway-old bench/instructions.sh
#
# Only the load is counted: callgrind starts with instrumentation off,
# and callgrind_control switches it on once loadgen's clients are
# connected (loadgen -wait-signal), off once loadgen is done. Under
# callgrind a server runs some 50 times slower, so what it does once a
# second (mochi's sweeps, the gateway's snapshots) weighs about 50
# times more per message than at full speed: compare the per-message
# parts, and read the totals with that in mind. Each target takes about
# a minute. Needs valgrind (3.19 here) and GODEBUG=asyncpreemptoff=1
# (set here: callgrind aborts on Go's preemption signal). On an AMD EPYC
# host valgrind 3.19 reports RDTSCP to the program and then cannot run
# it: the Go runtime dies with SIGILL in runtime.cputicks and loadgen
# reports its connection lost (seen 2026-11-29; it ran on the host of
# the day before).
set -euo pipefail
QOS=${QOS:-0}
DURATION=${DURATION:-1s}
command -v valgrind >/dev/null || { echo "instructions: valgrind not found (apt-get install -y valgrind)" >&2; exit 1; }
# shellcheck source=bench/targets.sh
. "$(dirname "$0")/targets.sh"
build_targets

# count NAME BIN: runs BIN (a gateway, or "mochi") under callgrind with
# loadgen against it; leaves NAME.ir (instructions), NAME.msgs (messages
# published) and NAME.fn (self instructions by function).
count() {
	local name=$1 bin=$2 dir="$work/run-$1"
	start_target "$name" "$bin" "$dir" env GODEBUG=asyncpreemptoff=1 \
		valgrind --tool=callgrind --instr-atstart=no "--callgrind-out-file=$dir/cg.out"
	start_load "$name" "$dir"
	callgrind_control -i on "$pid" >/dev/null 2>&1
	kill -USR1 "$lg"
	wait "$lg"
	callgrind_control -i off "$pid" >/dev/null 2>&1
	callgrind_control -d "$pid" >/dev/null 2>&1
	kill "$pid"
	wait "$pid" 2>/dev/null || true
	published "$dir" >"$work/$name.msgs"
	local out
	out=$(ls -S "$dir"/cg.out* | head -1)
	callgrind_annotate --threshold=100 --auto=no "$out" >"$dir/annotate"
	awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}' "$dir/annotate" >"$work/$name.ir"
	# "  1,234 ( 0.07%)  /path/file.go:pkg.(*T).Method [/bin]": the
	# function after the last ".go:" (or the file's name, for C).
	awk '/^ *[0-9,]+ +\( *[0-9.]+%\) +/ && !/PROGRAM TOTALS/ {
		n = $1; gsub(",", "", n)
		line = $0; sub(/^ *[0-9,]+ +\( *[0-9.]+%\) +/, "", line); sub(/ \[.*$/, "", line)
		i = index(line, ".go:"); if (i > 0) line = substr(line, i + 4)
		print n "\t" line
	}' "$dir/annotate" >"$work/$name.fn"
}

targets=(gateway mochi)
count gateway "$work/gateway"
count mochi mochi
if [ -n "${BASE:-}" ]; then
	cp "$BASE" "$work/base"
	count base "$work/base"
	targets+=(base)
fi

echo "instructions per published message, QoS $QOS, loadgen -duration $DURATION (50 publishers, 5 subscribers)"
for t in "${targets[@]}"; do
	awk -v t="$t" -v ir="$(cat "$work/$t.ir")" -v m="$(cat "$work/$t.msgs")" \
		'BEGIN {printf "%-8s %9d messages %8.0f instructions each\n", t, m, ir / m}'
done
echo
echo "by part (self instructions per message):"
for t in "${targets[@]}"; do
	awk -v t="$t" -v m="$(cat "$work/$t.msgs")" -F '\t' '
	function part(f) {
		if (f ~ /^github\.com\/mochi-mqtt\/server\/v2\.\(\*Hooks\)/) return "mochi hook dispatch"
		if (f ~ /devicegate\/broker\.\(\*throttle\)/) return "gateway: throttle hook"
		if (f ~ /devicegate\/broker\./) return "gateway: other hooks and broker"
		if (f ~ /devicegate\/devicelimit\./) return "gateway: quota table"
		if (f ~ /devicegate\//) return "gateway: the rest"
		if (f ~ /^github\.com\/mochi-mqtt\//) return "mochi: the rest"
		if (f ~ /^runtime\.(scan|greyobject|gcDrain|tryDefer|findObject|pcvalue|step|funcInfo|getStackMap|scanframe|typePointers|wbBuf|bulkBarrier|markroot|extractHeapBits|spanOf|textAddr|findfunc|readvarint|adjustframe|.*[Mm]ark|.*[Ss]weep|\(\*unwinder\)|\(\*stackScanState\)|\(\*stkframe\)|\(\*mspan\)|\(\*mheap\)|\(\*pallocBits\)|\(\*gcWork\)|\(\*mcentral\)|\(\*spanInlineMarkBits\)|\(\*moduledata\)|binarySearchTree)/) return "Go: garbage collector"
		if (f ~ /^runtime\.(mallocgc|nextFreeFast|memclr|newobject|makeslice|growslice|\(\*mcache\))/) return "Go: allocation"
		if (f ~ /^runtime\./) return "Go: scheduler, channels, the rest"
		return "everything else (syscall, net, bbolt, ...)"
	}
	{ s[part($2)] += $1 }
	END { for (p in s) printf "%s\t%s\t%.0f\n", t, p, s[p] / m }' "$work/$t.fn"
done | sort -t$'\t' -k2,2 -k1,1 | awk -F '\t' -v ts="${targets[*]}" '
	BEGIN { n = split(ts, T, " "); printf "%-42s", "part"; for (i = 1; i <= n; i++) printf "%10s", T[i]; print "" }
	{ v[$2, $1] = $3; if (!($2 in seen)) { seen[$2] = 1; P[++np] = $2 } }
	END { for (j = 1; j <= np; j++) { printf "%-42s", P[j]; for (i = 1; i <= n; i++) printf "%10d", v[P[j], T[i]]; print "" } }'
