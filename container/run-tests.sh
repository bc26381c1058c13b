#!/usr/bin/env bash
# make test-container: the container suites (container/tests with pytest,
# container/node/test with node --test) against the images `make image`
# built; arguments go to pytest. With podman, a `podman system service` on
# a socket of its own is the Docker API testcontainers talks to; it is
# started here and stopped on exit. testcontainers settings for these
# machines (docs/testing.md): no Ryuk reaper (its image cannot be pulled;
# every test removes its own containers), and the mapped ports on 127.0.0.1
# even though /.dockerenv makes testcontainers believe it runs inside a
# container (Python; Node's testcontainers needs only DOCKER_HOST and the
# Ryuk setting).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$root/container/containers.conf}"
engine=$(container/engine.sh)
if [ "$engine" = podman ]; then
  run=$(mktemp -d /tmp/rl-podman.XXXXXX)
  podman system service --time=0 "unix://$run/podman.sock" &
  service=$!
  trap 'kill "$service" 2>/dev/null; wait "$service" 2>/dev/null; rm -rf "$run"' EXIT
  export DOCKER_HOST="unix://$run/podman.sock"
  for _ in $(seq 200); do
    podman --url "$DOCKER_HOST" version >/dev/null 2>&1 && break
    kill -0 "$service" 2>/dev/null || { echo "run-tests.sh: podman system service exited" >&2; exit 1; }
    sleep 0.05
  done
fi
export TESTCONTAINERS_RYUK_DISABLED=true
export TESTCONTAINERS_CONNECTION_MODE=docker_host
export TC_HOST=127.0.0.1
rc=0
t0=$(date +%s)
( cd container && "$root/.venv/bin/python" -m pytest -q -rfEs -p no:cacheprovider tests "$@" ) || rc=1
t1=$(date +%s)
( cd container/node && node --test --test-concurrency=1 test/*.test.js ) || rc=1
t2=$(date +%s)
# Testcontainers for Java (clients/java/containers): the library on the
# images, and on the Redis image without the module (Lua twins)
if command -v mvn >/dev/null; then
  m2="$root/.cache/m2/repository"
  ( mvn -B -ntp -q -Dmaven.repo.local="$m2" -f clients/java/pom.xml install -DskipTests &&
    TESTCONTAINERS_HOST_OVERRIDE=127.0.0.1 mvn -B -ntp -q -Dmaven.repo.local="$m2" \
      -f clients/java/containers/pom.xml test ) || rc=1
else
  echo "run-tests.sh: mvn (Maven) is required for the Java recipe: make deps" >&2; rc=1
fi
t3=$(date +%s)
echo "test-container: python $((t1 - t0)) s, node $((t2 - t1)) s, java $((t3 - t2)) s"
exit $rc
