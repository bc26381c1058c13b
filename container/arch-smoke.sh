#!/usr/bin/env bash
# make test-image-arm64: a server image of another architecture answers
# under emulation (qemu-user through binfmt_misc; docs/arm64.md). Runs TAG
# with a port on 127.0.0.1 and checks, with the host's redis-cli: the
# kernel and the server report ARCH, the module is loaded from the image's
# path at the crate's version, a limiter decides exactly, and after SAVE
# and a container restart the limiter's state is still there.
#
#   container/arch-smoke.sh TAG ARCH      e.g. redis-ratelimit:0.2.0-redis-arm64 aarch64
set -euo pipefail
tag=${1:?usage: arch-smoke.sh TAG ARCH} arch=${2:?usage: arch-smoke.sh TAG ARCH}
root=$(cd "$(dirname "$0")/.." && pwd)
export CONTAINERS_CONF="${CONTAINERS_CONF:-$root/container/containers.conf}"
engine=$("$root/container/engine.sh")
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
case "$arch" in aarch64) platform=linux/arm64;; x86_64) platform=linux/amd64;; *) platform=linux/$arch;; esac
cid=$($engine run -d --platform "$platform" -p "127.0.0.1:$port:6379" "$tag")
trap '$engine rm -f "$cid" >/dev/null' EXIT
cli() { redis-cli -p "$port" "$@"; }
fail() { echo "arch-smoke.sh: $tag: $*" >&2; $engine logs "$cid" 2>&1 | tail -20 >&2; exit 1; }
up() {
  for _ in $(seq 600); do
    [ "$(cli ping 2>/dev/null)" = PONG ] && return
    [ "$($engine inspect -f '{{.State.Running}}' "$cid")" = true ] || fail "the server exited"
    sleep 0.1
  done
  fail "no PONG on port $port within 60 s"
}
up
[ "$($engine exec "$cid" uname -m)" = "$arch" ] || fail "uname -m in the container is not $arch"
cli info server | grep -q "^os:Linux .* $arch" || fail "INFO server: os is not $arch: $(cli info server | grep ^os:)"
modules=$(cli module list)
echo "$modules" | grep -qx ratelimit || fail "MODULE LIST: no ratelimit: $modules"
echo "$modules" | grep -qx /usr/local/lib/redis-ratelimit/libredis_ratelimit.so || fail "MODULE LIST: path: $modules"
got=$(cli RL.TOKENBUCKET rl:smoke 5 1 1000000 COST 2 | tr '\n' ' ')
case "$got" in "1 5 3 0 2000000 "|"1 5 3 0 1999999 ") ;; *) fail "RL.TOKENBUCKET COST 2: $got";; esac
[ "$(cli save)" = OK ] || fail "SAVE failed"
$engine restart "$cid" >/dev/null
up
got=$(cli RL.TOKENBUCKET rl:smoke 5 1 1000000 COST 3 | tr '\n' ' ')
case "$got" in "1 5 0 0 "*) ;; *) fail "after SAVE and a restart: RL.TOKENBUCKET COST 3: $got (state lost?)";; esac
[ "$(cli RL.TOKENBUCKET rl:smoke 5 1 1000000 | head -1)" = 0 ] || fail "the emptied bucket granted"
echo "$tag: $arch under emulation: module loaded, RL.TOKENBUCKET exact, state kept across SAVE and a restart"
