# A server image with the ratelimit module loaded, for integration tests and
# trials. NOT BUILT HERE: no container engine runs on the machines this
# project is developed on (see README, "Use it in your integration tests").
#
#   docker build -t redis-ratelimit .                                    # Valkey 8.1
#   docker build --build-arg SERVER_IMAGE=redis:7.4-bookworm -t redis-ratelimit:redis .
#   docker run --rm -p 6379:6379 redis-ratelimit
#
# The module is built on Debian 12 (glibc 2.36), the same base as the server
# images' bookworm variants, so its glibc need (2.34) is met.
ARG SERVER_IMAGE=valkey/valkey:8.1-bookworm

FROM rust:1-bookworm AS build
# redis-module's bindings are generated with bindgen, which needs libclang.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends clang libclang-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --lib \
 && objcopy --strip-debug target/release/libredis_ratelimit.so /libredis_ratelimit.so

FROM ${SERVER_IMAGE}
COPY --from=build /libredis_ratelimit.so /usr/local/lib/redis-ratelimit/libredis_ratelimit.so
COPY LICENSE /usr/local/share/doc/redis-ratelimit/LICENSE
# The official redis and valkey entrypoints prepend the server binary when
# the first argument is an option. Arguments given to `docker run` replace
# these: keep the --loadmodule when adding your own.
CMD ["--loadmodule", "/usr/local/lib/redis-ratelimit/libredis_ratelimit.so", "--protected-mode", "no"]
