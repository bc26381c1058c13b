//! The service against a real Redis or Valkey with the module
//! (REDIS_SERVER, RL_MODULE), through a gRPC client generated from Envoy's
//! protos and through `POST /json`. Every test starts its own server and
//! service (in-process: `server::start` with the settings of a map of
//! environment variables, as the binary's `main` does) on free ports, in a
//! temp dir, and stops them. One test binary (one link for make
//! test-service), a module per topic; what they share is in `support`, the
//! real servers of sentinels and clusters in `rl_test_support` (testing/rust).
//! The library's unit tests are in `units/`.

mod support;

mod algorithms;
mod atomic;
mod cache;
mod configuration;
mod debug;
mod decisions;
mod goaway;
mod lifecycle;
mod logging;
mod metrics;
mod negative;
mod outage;
mod quota;
mod reports;
mod settings_table;
mod spread;
mod statsd;
mod streams;
mod tls;
mod topology;
mod tracing;
mod units;
mod upstream;
mod xds;
