# Targets: test (default), build, bench, fuzz, tools.
GO          ?= go
BENCH_COUNT ?= 6
BENCH_FLAGS ?=
# Fuzz budgets are counts of executions, not durations: with a duration,
# Go 1.26's fuzz coordinator can fail a target with "context deadline
# exceeded" as the time runs out, having found nothing (a race fixed in
# Go 1.27, go.dev/issue/75804); a count has no deadline to race. The
# slowest target here runs about 2,400 executions a second.
FUZZTIME    ?= 300000x
# TEST_FUZZTIME is each fuzz target's share of `make test`.
TEST_FUZZTIME ?= 10000x
# TEST_TIMEOUT bounds each package's tests in `make test`: go test's
# default of 10 minutes is near what cmd/gateway takes on a loaded
# 2-core machine.
TEST_TIMEOUT ?= 30m
# STATICCHECK is run by `make vet` (and so `make test`), pinned.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# REVISION and REVISION_TIME stamp the commit beside VERSION (`gateway
# version`): the go command records them itself only in a plain git
# checkout, not in a worktree nor with -buildvcs=false.
REVISION      ?= $(shell git rev-parse HEAD 2>/dev/null)
REVISION_TIME ?= $(shell TZ=UTC git log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd 2>/dev/null)
LDFLAGS       := -X main.version=$(VERSION) -X main.revision=$(REVISION) -X main.revisionTime=$(REVISION_TIME)

# bash with pipefail, so that `go test | tee` fails when the tests do.
SHELL       := bash
.SHELLFLAGS := -eu -o pipefail -c

.PHONY: test build bench fuzz tools vet hostile
.PHONY: bench-e2e bench-feedback

# test: vet, every test with the race detector, the property tests and
# the timed device listing (API and console page) in full without it
# (the detector makes them 10 to 12 times slower), then a short fuzz
# pass.
test: tools vet
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...
	$(GO) test -count=1 -run '^TestProperty' ./devicelimit
	$(GO) test -count=1 -run '^TestDeviceListingScales$$' ./server
	$(GO) test -count=1 -run '^TestConsoleDevicesScale$$' ./admin/console
	$(MAKE) --no-print-directory fuzz FUZZTIME=$(TEST_FUZZTIME)

vet:
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# tools installs the programs the tests run (mosquitto...), or fails.
tools:
	./scripts/ensure-tools.sh

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o gateway ./cmd/gateway

# release: static binaries (CGO_ENABLED=0, -trimpath) for Linux on
# amd64, arm64 and 32-bit ARM v7 (Raspberry Pi 2 and later, most edge
# boards), stamped with VERSION, into DIST with their SHA256SUMS.
DIST     ?= dist
PLATFORMS ?= linux/amd64 linux/arm64 linux/arm/v7
.PHONY: release test-release
release:
	rm -rf $(DIST) && mkdir -p $(DIST)
	for p in $(PLATFORMS); do \
		IFS=/ read -r os arch variant <<<"$$p"; \
		name=gateway-$(VERSION)-$$os-$$arch$${variant}; \
		echo "build $$name"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch GOARM=$${variant#v} \
			$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(DIST)/$$name ./cmd/gateway; \
	done
	cd $(DIST) && sha256sum gateway-* > SHA256SUMS

# image: the container image deploy/Containerfile describes, built with
# podman: the static binary, the host's CA bundle and an empty data
# directory go into IMAGE_CTX, the build context; nothing is pulled.
IMAGE     ?= devicegate:$(VERSION)
IMAGE_CTX ?= dist/image
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
.PHONY: image test-image
image:
	rm -rf $(IMAGE_CTX) && mkdir -p $(IMAGE_CTX)/data
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(IMAGE_CTX)/gateway ./cmd/gateway
	cp $(CA_BUNDLE) $(IMAGE_CTX)/ca-certificates.crt
	podman build --format docker -f deploy/Containerfile -t $(IMAGE) $(IMAGE_CTX)

# test-image: make image, then take the binary out of the image and run
# it (a container cannot be run on these machines: the sandbox refuses
# the runtime's setrlimit).
test-image:
	DEVICEGATE_IMAGE_TEST=1 $(GO) test -timeout 20m -count=1 -run '^TestImage$$' -v ./cmd/gateway

# test-release: make release into a temporary directory and check every
# binary's build information (a few minutes: three cross-compilations);
# then go install the working tree from a file-based module proxy, as a
# published version would install (TestGoInstall: the whole module and
# its dependencies compiled again).
test-release:
	DEVICEGATE_RELEASE_TEST=1 $(GO) test -timeout 40m -count=1 -run '^(TestRelease|TestGoInstall)$$' -v ./cmd/gateway

# bench writes bench.out (gitignored) for benchstat.
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count $(BENCH_COUNT) $(BENCH_FLAGS) ./... | tee bench.out

# fuzz runs every Fuzz target of every package for FUZZTIME each.
fuzz:
	@for pkg in $$($(GO) list ./...); do \
		list=$$($(GO) test -list '^Fuzz' $$pkg); \
		for target in $$(grep '^Fuzz' <<<"$$list" || true); do \
			echo "fuzz $$pkg $$target for $(FUZZTIME)"; \
			$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; \
	done

# bench-e2e runs the gateway, plain mochi and Mosquitto side by side under
# one paho load (bench/harness; a few minutes) and prints the table.
# BENCH_E2E_FLAGS passes options, e.g. -rounds 5 or -profile DIR.
BENCH_E2E_FLAGS ?=
bench-e2e: tools
	$(GO) run ./bench/harness $(BENCH_E2E_FLAGS)
# bench-compare: this build beside another (BASE, a commit or a gateway
# binary) in the same rounds, end to end and forwarding, with the ratios
# (bench/harness -baseline). BENCH_E2E_FLAGS and BENCH_FORWARD_FLAGS apply.
BASE ?= HEAD~1
.PHONY: bench-compare
bench-compare: tools
	$(GO) run ./bench/harness -baseline $(BASE) $(BENCH_E2E_FLAGS)
	$(GO) run ./bench/harness -mode forward -baseline $(BASE) $(BENCH_FORWARD_FLAGS)
# bench-feedback: server CPU per message of two gateways under one MQTT 5
# QoS 1 load, device feedback off and always (bench/harness -mode
# feedback), and the ratio. BENCH_E2E_FLAGS passes options.
bench-feedback: tools
	$(GO) run ./bench/harness -mode feedback $(BENCH_E2E_FLAGS)
# bench-density: memory per idle connection of the gateway (at its
# defaults), plain mochi and Mosquitto, 10,000 connections each
# (bench/harness -mode density). BENCH_DENSITY_FLAGS passes options,
# e.g. -conns 100000 (needs an open-file hard limit above it), -profile DIR
# (heap and goroutine profiles, and the figures after forced collections),
# -gateway-mqtt "max_pending_writes: 16".
BENCH_DENSITY_FLAGS ?=
.PHONY: bench-density
bench-density: tools
	$(GO) run ./bench/harness -mode density $(BENCH_DENSITY_FLAGS)
# test-forward-outage: the forward outage runs at full length, 50 devices
# through a 30 s outage of the destination (Mosquitto, with and without
# kill -9; Redis, NATS JetStream and Kafka with kill -9); make test runs
# 5 s.
.PHONY: test-forward-outage
test-forward-outage: tools
	DEVICEGATE_FORWARD_OUTAGE=30s $(GO) test -count=1 -run '^TestForward(Stream)?OutageProcess$$' -v ./cmd/gateway
# test-forward-refused: the refused-for-good runs at full length, 20 devices publishing
# for 20 s through a real gateway while each destination (Mosquitto over
# MQTT 5, Redis, NATS JetStream, Kafka) refuses one device's messages
# for good; make test runs 5 s.
.PHONY: test-forward-refused
test-forward-refused: tools
	DEVICEGATE_REFUSED_RUN=20s $(GO) test -count=1 -run '^TestForwardRefusedProcess$$' -v ./cmd/gateway
# bench-forward: the gateway without forwarding, forwarding to Mosquitto,
# and Mosquitto's bridge side by side, then a 1,000,000-message backlog's
# drain with the gateway's anonymous memory (bench/harness -mode forward).
BENCH_FORWARD_FLAGS ?=
.PHONY: bench-forward
bench-forward: tools
	$(GO) run ./bench/harness -mode forward $(BENCH_FORWARD_FLAGS)
# bench-lease: what crash leases cost, make sim-10k's fleet (10,000
# devices at 0.2 messages/s, 5 per 10 s, 60 s), with
# persist.after_crash charge and forgive back to back in both orders,
# and charge over forgive (scripts/lease-cost.sh; DEVICES, RATE,
# DURATION, LIMIT, WINDOW, ROUNDS, PATTERN change it).
.PHONY: bench-lease
bench-lease: build
	scripts/lease-cost.sh lease-out
# fleet: the fleet harness (fleet.TestFleetHarness; docs/simulator.md,
# "A fleet of gateways"): FLEET_GATEWAYS gateway processes in cluster
# mode on one redis-server (FLEET_REDIS=server) or a Redis Cluster of
# three masters and three replicas (cluster), devices spread over them
# or through HAProxy (FLEET_HAPROXY=conn or id), the simulator split
# over as many processes as the open-file limit needs; phase 1 every
# device at FLEET_RATE with a gateway killed, phase 2 one tenant's
# devices at 1/s with a Redis server killed (in a tenant group of the
# windows FLEET_TENANT_GROUP gives, such as 20000/10s; none when empty).
# Bounded: it ends after FLEET_DURATION + FLEET_TENANT_DURATION and the
# drains.
FLEET_DEVICES        ?= 100000
FLEET_GATEWAYS       ?= 6
FLEET_RATE           ?= 0.1
FLEET_DURATION       ?= 120s
FLEET_TENANT_DEVICES ?= 10000
FLEET_TENANT_DURATION ?= 60s
FLEET_REDIS          ?= server
FLEET_HAPROXY        ?= none
FLEET_DECISIONS      ?= owner
FLEET_TENANT_GROUP   ?=
.PHONY: fleet
fleet: tools
	DEVICEGATE_FLEET=1 DEVICEGATE_FLEET_DEVICES=$(FLEET_DEVICES) DEVICEGATE_FLEET_GATEWAYS=$(FLEET_GATEWAYS) \
	DEVICEGATE_FLEET_RATE=$(FLEET_RATE) DEVICEGATE_FLEET_DURATION=$(FLEET_DURATION) \
	DEVICEGATE_FLEET_TENANT_DEVICES=$(FLEET_TENANT_DEVICES) DEVICEGATE_FLEET_TENANT_DURATION=$(FLEET_TENANT_DURATION) \
	DEVICEGATE_FLEET_REDIS=$(FLEET_REDIS) DEVICEGATE_FLEET_HAPROXY=$(FLEET_HAPROXY) \
	DEVICEGATE_FLEET_DECISIONS=$(FLEET_DECISIONS) DEVICEGATE_FLEET_TENANT_GROUP=$(FLEET_TENANT_GROUP) \
		$(GO) test -count=1 -timeout 60m -run '^TestFleetHarness$$' -v ./fleet
# test-timed runs the tests whose bound is a time (the device listing's
# 300 ms at 100,000 devices): on a quiet machine, before resolving.
.PHONY: test-timed
test-timed: tools
	DEVICEGATE_TIMED_TESTS=1 $(GO) test -count=1 -run '^TestDeviceListingScales$$' -v ./server
# hostile runs the hostile-client test at full size: 100k distinct client
# IDs (make test runs 10k).
hostile:
	DEVICEGATE_HOSTILE_IDS=100000 $(GO) test -count=1 -run '^TestHostileClients$$' -v ./broker
# Simulator runs too long for `make test`; reports go to SIM_OUT (gitignored).
SIM_OUT ?= sim-out
.PHONY: sim-acceptance sim-10k sim-upstream sim-feedback report-png

# sim-acceptance: 1000 devices on an embedded gateway, 30 s, judged.
sim-acceptance: build
	mkdir -p $(SIM_OUT)
	./gateway simulate --embedded --devices 1000 --rate 5/s --duration 30s --limit 50 --window 10s \
		--json $(SIM_OUT)/acceptance.json --report $(SIM_OUT)/acceptance.html

# sim-upstream: 1000 devices forwarded to an upstream
# through a 20 s outage of the link.
sim-upstream: build
	mkdir -p $(SIM_OUT)
	./gateway simulate --embedded --upstream embedded --devices 1000 --rate 5/s --duration 40s --limit 50 --window 10s \
		--upstream-outage-at 10s --upstream-outage-for 20s --json $(SIM_OUT)/upstream.json --report $(SIM_OUT)/upstream.html

# sim-10k: 10,000 devices at 0.2/s for 60 s against a separate gateway, with CPU and memory of both.
sim-10k: build
	./scripts/sim-10k.sh $(SIM_OUT)

# sim-feedback: 1000 devices each wanting twice its quota
# (two message windows, a byte window, a topic class) for 120 s, half
# naive, half adaptive (pacing by RateLimit); the table in
# docs/device-feedback.md comes from its summary.
sim-feedback: build
	mkdir -p $(SIM_OUT)
	./gateway simulate --spawn --config scripts/sim-feedback.yaml --devices 1000 --ramp-up 200 \
		--client 50%:lean,50%:adaptive --rate 80/m --payload-size 100 --duration 120s \
		--windows 30/1m,400/10m,6KiB/1m --topic-class alarms:4 --drain 10s \
		--json $(SIM_OUT)/feedback.json --report $(SIM_OUT)/feedback.html

# report-png: render REPORT (default: the acceptance run's) to a PNG in headless Chromium.
REPORT ?= $(SIM_OUT)/acceptance.html
report-png:
	./scripts/report-png.sh $(REPORT) $(REPORT:.html=.png)

# console-shots: run the console's browser tests and keep their
# screenshots of every page and state, and the overview's page text, in
# console-shots/ (gitignored; see docs/console.md).
.PHONY: console-shots
console-shots: tools
	DEVICEGATE_CONSOLE_SHOTS=$(CURDIR)/console-shots $(GO) test -count=1 -run '^TestConsole(InBrowser|NextMessage|OperatorWork|DeadLetters|Live)$$' -v ./admin/console

# console-scale: the Devices page's load times in Chromium and the
# history's bytes per device, at 100,000 tracked devices, without the
# race detector (docs/console.md).
.PHONY: console-scale
console-scale: tools
	$(GO) test -count=1 -run '^TestConsoleDevicesScale$$' -v ./admin/console
	$(GO) test -count=1 -run '^TestSeriesMemory$$' -v ./broker
