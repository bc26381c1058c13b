//! redis-ratelimit-service: a drop-in for envoyproxy/ratelimit, Envoy's
//! global rate-limit service, on redis-ratelimit. The same gRPC API
//! (`envoy.service.ratelimit.v3.RateLimitService`), the same YAML
//! configuration and environment variables; each request's descriptors
//! decided in one atomic `RL.MULTI` through the Rust client.
//!
//! * [`conn`] — the connection of `REDIS_TYPE` (single, sentinel, cluster).
//! * [`config`] — the YAML files, their load errors and descriptor matching.
//! * [`settings`] — the environment variables.
//! * [`upstream_settings`] — the status of each of envoyproxy/ratelimit's settings.
//! * [`runtime`] — the configuration directory and its hot reload.
//! * [`service`] — `ShouldRateLimit`: [`plan`] → [`backend`] → [`respond`].
//! * [`plan`] — a request and the configuration give the parts to decide (pure).
//! * [`backend`] — the parts decided in one call on Redis, through the Rust client.
//! * [`spread`] — the keys' hash tags; parts across cluster slots, reserved then refunded.
//! * [`respond`] — the parts' states give statuses, headers and statistics (pure).
//! * [`dynamic_metadata`] — `RESPONSE_DYNAMIC_METADATA`: the response's dynamic metadata.
//! * [`error`] — why a request gets no decision.
//! * [`json`] — proto3 JSON for `POST /json`.
//! * [`server`] — the gRPC and HTTP listeners.
//! * [`metrics`] — the statistics, Prometheus `/metrics`.
//! * [`statsd`] — the statsd and DogStatsD sinks.
//! * [`mapper`] — `PROMETHEUS_MAPPER_YAML`, a statsd-exporter mapping.
//! * [`xds`] — `CONFIG_TYPE=GRPC_XDS_SOTW`: the configuration over xDS.
//! * [`overcache`] — `LOCAL_CACHE_SIZE_IN_BYTES`: keys known over their limit.
//! * [`xds_settings`] — the xDS client's settings.
//! * [`tls`] — the gRPC listener's TLS.
//! * [`connage`] — `GRPC_MAX_CONNECTION_AGE_GRACE`: a connection ended at its age and grace.
//! * [`logger`] — `LOG_LEVEL`, `LOG_FORMAT`: the process's log lines, as upstream's logrus writes them.
//! * [`debug`] — the debug listener (`DEBUG_HOST:DEBUG_PORT`): `/rlconfig`, `/stats`.
//! * [`trace`] — `TRACING_ENABLED`: the spans of `ShouldRateLimit`, exported over OTLP.
//! * [`otlp`] — OTLP's messages and one export over HTTP or gRPC.
//! * [`otlp_settings`] — the tracing settings (`TRACING_*`, `OTEL_*`).
//! * [`gosyntax`] — Go's durations and booleans, as upstream's settings read them.
#![warn(missing_docs)]

// first: its `log!` macro is used by the modules below
#[macro_use]
pub mod logger;

pub mod backend;
pub mod config;
pub mod conn;
pub mod connage;
pub mod debug;
pub mod dynamic_metadata;
pub mod error;
pub mod gosyntax;
pub mod json;
pub mod mapper;
pub mod metrics;
pub mod otlp;
pub mod otlp_settings;
pub mod overcache;
pub mod plan;
pub mod respond;
pub mod runtime;
pub mod server;
pub mod service;
pub mod settings;
pub mod spread;
pub mod statsd;
pub mod tls;
pub mod trace;
pub mod upstream_settings;
pub mod xds;
pub mod xds_settings;
