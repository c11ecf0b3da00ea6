#!/usr/bin/env bash
# report-png.sh renders a simulator HTML report (--report FILE.html) to a
# PNG in headless Chromium, installing Debian's chromium when missing.
# Usage: scripts/report-png.sh REPORT.html OUT.png
set -euo pipefail

html=${1:?usage: report-png.sh REPORT.html OUT.png}
png=${2:?usage: report-png.sh REPORT.html OUT.png}
[ -f "$html" ] || { echo "report-png: $html does not exist" >&2; exit 1; }
if ! command -v chromium >/dev/null 2>&1; then
	echo "report-png: installing Debian's chromium" >&2
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
fi
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
# The flags keep Chromium off the network: the page must render from
# itself alone.
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
	--disable-background-networking --disable-component-update --disable-sync \
	--user-data-dir="$profile" --hide-scrollbars --window-size=1040,1500 \
	--screenshot="$(realpath -m "$png")" "file://$(realpath "$html")"
echo "report-png: wrote $png"
