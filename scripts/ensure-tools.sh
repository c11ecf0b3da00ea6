#!/usr/bin/env bash
# ensure-tools.sh makes sure the external programs the tests run are
# installed, installing the missing ones from Debian packages. It fails
# loudly when it cannot: a test that needs a tool must never be skipped
# because the tool is absent.
#
# Add a tool by adding a "program package" line to TOOLS; "py:MODULE"
# as the program checks that Debian's python3 imports MODULE.
#
# Besides Debian's packages, the real-client tests (interop/) need
# MQTT.js, npm's "mqtt" package: installed with Debian's npm under
# $DEVICEGATE_NPM_DIR (default ~/.cache/devicegate/npm), never in the
# repository. The tests look for it there.
set -euo pipefail

TOOLS=(
	"mosquitto_pub mosquitto-clients"
	"mosquitto_sub mosquitto-clients"
	"mosquitto mosquitto"
	"redis-server redis-server"
	"redis-cli redis-tools"
	"curl curl"
	"nats-server nats-server"
	"haproxy haproxy"
	"chromium chromium"
	"node nodejs"
	"npm npm"
	"python3 python3"
	"py:paho.mqtt.client python3-paho-mqtt"
)

# MQTT.js, its version pinned: the interop tests run the docs' example
# with it.
MQTTJS=mqtt@5.16.0
NPM_DIR="${DEVICEGATE_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/devicegate/npm}"

# have reports whether a program is on PATH or in an sbin directory,
# which non-root PATHs often leave out (mosquitto lives in /usr/sbin).
have() {
	case "$1" in
	py:*) [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import ${1#py:}" >/dev/null 2>&1 ;;
	*) command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ] ;;
	esac
}

# ensure_mqttjs installs MQTT.js under NPM_DIR when it is not there.
ensure_mqttjs() {
	if [ -f "$NPM_DIR/node_modules/mqtt/package.json" ]; then
		return
	fi
	echo "ensure-tools: installing $MQTTJS under $NPM_DIR" >&2
	mkdir -p "$NPM_DIR"
	if ! npm install --prefix "$NPM_DIR" --no-audit --no-fund --no-save "$MQTTJS" >&2; then
		echo "ensure-tools: FAILED to install $MQTTJS with npm" >&2
		exit 1
	fi
}

missing=()
for entry in "${TOOLS[@]}"; do
	read -r tool pkg <<<"$entry"
	if ! have "$tool"; then
		echo "ensure-tools: $tool is missing (package $pkg)" >&2
		case " ${missing[*]-} " in
		*" $pkg "*) ;;
		*) missing+=("$pkg") ;;
		esac
	fi
done
if [ ${#missing[@]} -eq 0 ]; then
	ensure_mqttjs
	exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
	echo "ensure-tools: FAILED: apt-get not found; install ${missing[*]} by hand" >&2
	exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
	if ! command -v sudo >/dev/null 2>&1; then
		echo "ensure-tools: FAILED: not root and no sudo; install ${missing[*]} by hand" >&2
		exit 1
	fi
	sudo=(sudo -n) # never wait for a password in CI
fi

echo "ensure-tools: installing ${missing[*]}" >&2
if ! "${sudo[@]}" apt-get update ||
	! DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"; then
	echo "ensure-tools: FAILED to install ${missing[*]}" >&2
	exit 1
fi

for entry in "${TOOLS[@]}"; do
	read -r tool pkg <<<"$entry"
	if ! have "$tool"; then
		echo "ensure-tools: FAILED: $tool still missing after installing $pkg" >&2
		exit 1
	fi
done
ensure_mqttjs
