# A server image with the ratelimit module loaded, for integration tests and
# trials. `make image` builds two (container/image.sh):
#
#   redis-ratelimit:<version>-redis    FROM redis:7.4-bookworm
#   redis-ratelimit:<version>-valkey   FROM valkey/valkey:9.1-bookworm
#
# where those official images can be pulled, and FROM local Debian bases
# (container/base.Containerfile) where no registry is reachable. By hand:
#
#   make dist
#   docker build --build-arg SERVER_IMAGE=redis:7.4-bookworm -t redis-ratelimit:redis .
#   docker run --rm -p 127.0.0.1:6379:6379 redis-ratelimit:redis
#
# The image takes the module `make dist` built (dist/*.tar.gz, checked
# against its SHA256SUMS): compiling it needs Rust 1.88, newer than a
# bookworm image's. The module is built on Debian 12 (glibc 2.36), the
# base of the servers' bookworm variants, so its glibc need (2.34) is met.
ARG SERVER_IMAGE=redis:7.4-bookworm
FROM ${SERVER_IMAGE}
# The tarball of `make dist`; ADD unpacks it.
ARG DIST=dist/redis-ratelimit-*-linux-*.tar.gz
ADD ${DIST} /usr/local/lib/
RUN set -e; cd /usr/local/lib; \
    mv redis-ratelimit-*-linux-*/ redis-ratelimit; \
    cd redis-ratelimit && sha256sum --quiet -c SHA256SUMS
# The official redis and valkey entrypoints (and the local bases' one) put
# the server binary in front when the first argument is an option.
# Arguments given to `docker run` replace these: keep the --loadmodule when
# adding your own.
CMD ["--loadmodule", "/usr/local/lib/redis-ratelimit/libredis_ratelimit.so", "--protected-mode", "no"]
