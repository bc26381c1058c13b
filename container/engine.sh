#!/usr/bin/env bash
# Prints the container engine to use: docker when a docker daemon answers,
# else podman (installed with runc from Debian's packages when missing).
# A docker client without a daemon does not count: the engine is run, not
# just looked up.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  echo docker; exit 0
fi
if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
  sudo=$([ "$(id -u)" = 0 ] || echo sudo)
  echo "engine.sh: no docker daemon answers; installing podman and runc" >&2
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq podman runc >/dev/null
fi
if ! err=$(podman info 2>&1 >/dev/null); then
  echo "engine.sh: podman does not run: $err" >&2; exit 1
fi
echo podman
