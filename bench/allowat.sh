#!/usr/bin/env bash
# allowat.sh runs BenchmarkAllowAt (devicelimit) RUNS times, one pass at a
# time, so the table and the x/time/rate baseline run back to back for each
# size and mode in every pass, under the same load of a shared machine.
# It writes the raw results to OUT (default allowat.out, for benchstat)
# and prints, per case, the median and range of the per-pass ratios
# table/x/time/rate of ns/op, and the ratio of bytes per device.
#
#	bench/allowat.sh            # 6 passes
#	RUNS=10 OUT=/tmp/a.out bench/allowat.sh
set -euo pipefail
RUNS=${RUNS:-6}
OUT=${OUT:-allowat.out}
GO=${GO:-go}
: >"$OUT"
for i in $(seq "$RUNS"); do
	echo "allowat: pass $i of $RUNS" >&2
	"$GO" test -run '^$' -bench 'AllowAt/impl=(table|xrate)/' -benchmem -count 1 ./devicelimit/ >>"$OUT"
done
awk '
/^BenchmarkAllowAt\// {
	split($1, p, "/"); impl = p[2]; sub("impl=", "", impl)
	c = p[3] "/" p[4]; sub("-[0-9]+$", "", c)
	for (f = 3; f < NF; f++) {
		if ($(f+1) == "ns/op") ns = $f
		if ($(f+1) == "B/device") bd = $f
	}
	n = ++count[impl, c]
	val[impl, c, n] = ns; mem[impl, c] = bd
	if (!(c in seen)) { seen[c] = 1; order[++cases] = c }
}
END {
	printf "%-26s %8s %14s %10s\n", "case", "ns/op", "(range)", "B/device"
	for (k = 1; k <= cases; k++) {
		c = order[k]; m = count["table", c]
		for (i = 1; i <= m; i++) r[i] = val["table", c, i] / val["xrate", c, i]
		# insertion sort, then the median
		for (i = 2; i <= m; i++) { x = r[i]; for (j = i - 1; j >= 1 && r[j] > x; j--) r[j+1] = r[j]; r[j+1] = x }
		med = (m % 2) ? r[(m+1)/2] : (r[m/2] + r[m/2+1]) / 2
		printf "%-26s %8.2f %6.2f–%-6.2f %10.2f\n", c, med, r[1], r[m], mem["table", c] / mem["xrate", c]
	}
	print "ratios table / x/time/rate, median of the per-pass ratios (lower is better)"
}' "$OUT"
