# targets.sh: what bench/instructions.sh and bench/kernel.sh share,
# sourced by them: a scratch directory ($work), building the servers
# and loadgen, starting one server with its load, and the gateway's
# configuration for it. GO names the go command (default go). On exit,
# by success or failure, the processes started here (and those a script
# adds to pids) are ended, by their PIDs, and $work removed.

GO=${GO:-go}
work=$(mktemp -d)
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT

# build_targets builds this build's gateway, plain mochi and loadgen
# into $work.
build_targets() {
	"$GO" build -o "$work/gateway" ./cmd/gateway
	"$GO" build -o "$work/plainmochi" ./bench/plainmochi
	"$GO" build -o "$work/loadgen" ./bench/loadgen
}

# start_target NAME BIN DIR [WRAPPER...]: starts BIN (a gateway binary,
# or "mochi" for plain mochi) on 127.0.0.1:0 with its log in DIR/log,
# under WRAPPER when given (valgrind ...), and waits (a minute at most:
# under callgrind a start takes some 50 times longer) until it logs its
# address. Sets pid and addr.
start_target() {
	local name=$1 bin=$2 dir=$3 pattern
	shift 3
	mkdir -p "$dir"
	if [ "$bin" = mochi ]; then
		"$@" "$work/plainmochi" -addr 127.0.0.1:0 >"$dir/log" 2>&1 &
		pid=$!
		pids+=("$pid")
		pattern='s/^listening \([0-9.:]*\).*/\1/p'
	else
		cat >"$dir/gateway.yaml" <<EOF
mqtt: {tcp: "127.0.0.1:0", consumers: {client_ids: ["sub-*"]}}
admin: {addr: "127.0.0.1:0"}
data_dir: "$dir/data"
limits:
  default: {limit: 1000000000, window: 1s, policy: drop}
EOF
		"$@" "$bin" serve --config "$dir/gateway.yaml" >"$dir/log" 2>&1 &
		pid=$!
		pids+=("$pid")
		pattern='s/.*msg="mqtt listening" addr=\([0-9.:]*\).*/\1/p'
	fi
	addr=
	for _ in $(seq 600); do
		addr=$(sed -n "$pattern" "$dir/log" | head -1)
		[ -n "$addr" ] && break
		sleep 0.1
	done
	[ -n "$addr" ] || { echo "$0: $name did not start; its log:" >&2; cat "$dir/log" >&2; exit 1; }
}

# start_load NAME DIR: starts loadgen (QOS, DURATION) against $addr,
# waiting for the signal to publish, and returns once its clients are
# connected. Sets lg (its PID); its report goes to DIR/loadgen.json.
start_load() {
	local name=$1 dir=$2
	"$work/loadgen" -addr "$addr" -qos "$QOS" -duration "$DURATION" -wait-signal >"$dir/loadgen.json" 2>"$dir/loadgen.log" &
	lg=$!
	pids+=("$lg")
	until grep -qs '^loadgen: connected' "$dir/loadgen.log"; do
		kill -0 "$lg" 2>/dev/null || { echo "$0: loadgen failed against $name:" >&2; cat "$dir/loadgen.log" >&2; exit 1; }
		sleep 0.1
	done
}

# published DIR prints the messages loadgen published (DIR/loadgen.json).
published() {
	sed -n 's/.*"published":\([0-9]*\).*/\1/p' "$1/loadgen.json"
}
