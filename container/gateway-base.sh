#!/usr/bin/env bash
# The base of the example gateway's image (examples/python/Containerfile)
# where python:3.11-slim-bookworm cannot be pulled: Debian's python3 from
# mmdebstrap (no mirror argument: the archive apt uses), with the test
# virtualenv's redis-py (the version clients/python/requirements.txt pins)
# copied in. Made once, then kept in the engine's image store:
#   localhost/redis-ratelimit-python-base:bookworm
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$root/container/containers.conf}"
engine=$(container/engine.sh)
tag=localhost/redis-ratelimit-python-base:bookworm
rootfs=localhost/redis-ratelimit-python-rootfs:bookworm
work=$root/target/container
mkdir -p "$work"
if ! $engine image inspect "$rootfs" >/dev/null 2>&1; then
  echo "gateway-base.sh: making $rootfs with mmdebstrap (once; minutes)"
  rm -f "$work/python-rootfs.tar"
  # Debian 12's python3 is 3.11.2: redis-py imports async_timeout before 3.11.3.
  mmdebstrap --quiet --variant=minbase --include=python3,python3-async-timeout bookworm "$work/python-rootfs.tar"
  $engine import -q "$work/python-rootfs.tar" "$rootfs" >/dev/null
  rm -f "$work/python-rootfs.tar"
fi
site=$("$root/.venv/bin/python" -c 'import os, redis; print(os.path.dirname(os.path.dirname(redis.__file__)))')
ctx=$work/python-base
rm -rf "$ctx" && mkdir -p "$ctx/site"
cp -r "$site/redis" "$ctx/site/"
printf 'FROM %s\nCOPY site/ /usr/local/lib/python3.11/dist-packages/\n' "$rootfs" > "$ctx/Containerfile"
$engine build -q -f "$ctx/Containerfile" -t "$tag" "$ctx" >/dev/null
echo "$tag"
