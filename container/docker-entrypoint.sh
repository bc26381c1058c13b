#!/bin/sh
# Entrypoint of the local Debian base images (container/image.sh): what the
# official redis and valkey images' entrypoints do with their arguments, so
# that one Dockerfile and one CMD serve both. An argument list that starts
# with an option (or a .conf file), or is empty, gets the server binary put
# in front.
set -e
[ $# -gt 0 ] || set -- "$RL_SERVER"
case "$1" in
  -*|*.conf) set -- "$RL_SERVER" "$@" ;;
esac
exec "$@"
