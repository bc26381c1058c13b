#!/bin/bash
# An arm64 Redis 7.0 to run under qemu-user on an x86_64 host (make
# arm64-server; docs/arm64.md): Debian 12's arm64 packages, downloaded with
# apt-get download and unpacked with dpkg -x into ROOT (nothing is installed
# on the host), and ROOT/redis-server, a wrapper that runs the server with
# `qemu-aarch64 -L ROOT`.
#
# Debian ships the server binary in redis-tools (as redis-check-rdb, which
# acts as the server unless called by a check-* name), so the server is a
# symlink named redis-server to it. Every library that the binary and the
# libraries themselves need (readelf -d: NEEDED) must be in ROOT: a missing
# one is named and the script fails (qemu would otherwise find it on the
# host, in /usr/lib/aarch64-linux-gnu, when the cross toolchain put it there).
#
#   tools/arm64-root.sh ROOT
set -euo pipefail
root=${1:?usage: arm64-root.sh ROOT}
PACKAGES="redis-tools libc6 libgcc-s1 libstdc++6 libatomic1 libssl3 libjemalloc2 liblzf1 libsystemd0
          libcap2 libgcrypt20 libgpg-error0 liblzma5 libzstd1 liblz4-1"
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)

rm -rf "$root" && mkdir -p "$root/debs"
arm64=$(for p in $PACKAGES; do echo "$p:arm64"; done)
# Stale package lists name versions the mirror no longer has: update once.
(cd "$root/debs" && apt-get download -q $arm64 2>/dev/null) || {
  $SUDO apt-get update -qq
  (cd "$root/debs" && apt-get download -q $arm64)
}
for deb in "$root"/debs/*.deb; do dpkg -x "$deb" "$root"; done
ln -s redis-check-rdb "$root/usr/bin/redis-server"

# Each NEEDED library of the server and of every library it pulls in.
libdirs=("$root/lib/aarch64-linux-gnu" "$root/usr/lib/aarch64-linux-gnu")
find_lib() { for d in "${libdirs[@]}"; do [ ! -e "$d/$1" ] || { echo "$d/$1"; return; }; done; }
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
todo=("$root/usr/bin/redis-check-rdb") seen=" " missing=""
while [ ${#todo[@]} -gt 0 ]; do
  elf=${todo[0]} todo=("${todo[@]:1}")
  for lib in $(needed "$elf"); do
    case "$seen" in *" $lib "*) continue;; esac
    seen="$seen$lib "
    path=$(find_lib "$lib")
    if [ -z "$path" ]; then missing="$missing $lib"; else todo+=("$(readlink -f "$path")"); fi
  done
done
[ -z "$missing" ] || { echo "arm64-root.sh: not in $root:$missing (add its package)" >&2; exit 1; }

cat > "$root/redis-server" <<EOF
#!/bin/sh
# Debian 12's arm64 Redis under qemu-user (tools/arm64-root.sh).
exec qemu-aarch64 -L "$root" "$root/usr/bin/redis-server" "\$@"
EOF
chmod +x "$root/redis-server"
"$root/redis-server" --version | grep -q '^Redis server v=7\.0\.' || {
  echo "arm64-root.sh: $root/redis-server --version: not Redis 7.0" >&2; exit 1; }
echo "$root/redis-server: $("$root/redis-server" --version)"
