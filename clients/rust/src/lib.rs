//! Client library for redis-ratelimit: the contract of `clients/DESIGN.md`
//! (the one the Python and Node libraries follow) for Rust services.
//!
//! * Policies ([`token_bucket`], [`sliding_log`], [`sliding_counter`],
//!   [`fixed_window`], [`all_of`] with weights), refused
//!   at construction when out of range.
//! * Keys ([`make_key`] with the hash tag, [`key_slot`]); the keys of one
//!   `all_of` call must share a cluster slot, checked before any call.
//! * [`RateLimit`] over a redis-rs async connection: one bounded call per
//!   decision (the library's own timeout, whatever the driver does), the
//!   module's commands or the Lua twins, a circuit breaker and panic limits.
//! * [`LeasedLimiter`]s ([`RateLimit::leased`]): a local reservoir per key
//!   filled with `PARTIAL` leases, refunded on idle, eviction and close.
//! * In-flight limits ([`RateLimit::inflight`] on a [`concurrency`]
//!   policy): a [`Guard`] holds units until it is dropped, renews its lease
//!   meanwhile, and falls back to a local in-flight limit under the breaker.
//! * [`headers`] of a [`Decision`], identical to the other libraries'.
//! * [`SentinelConnection`] (feature `sentinel`, on by default): a
//!   connection that follows a Sentinel service's primary across failovers.
//! * [`RateLimitLayer`] (feature `tower`, on by default): a `tower::Layer`
//!   for axum, hyper and tonic services, per request or leased; 429 (or
//!   gRPC `RESOURCE_EXHAUSTED`) with the headers.
//!
//! See the crate README for a first call, the driver choice and the tests.
#![warn(missing_docs)]

// I/O-free: what a decision sends and how its reply reads, the policies,
// decisions, breaker and panic limits, settings and counters.
mod answer;
mod breaker;
mod decision;
mod error;
mod headers;
mod inflight;
mod keys;
mod metrics;
mod options;
mod policy;
mod request;
mod reserve;
mod reservoir;
// The transport (connection, timeout, breaker, detection, strict mode) and
// what is built on it.
mod client;
mod lease;
#[cfg(feature = "sentinel")]
mod sentinel;
#[cfg(feature = "tower")]
mod tower;
mod transport;

pub use breaker::{Breaker, Panic, State};
pub use client::{Limiter, RateLimit};
pub use decision::{Decision, Part, Source};
pub use error::{Error, Result};
pub use headers::{headers, problem, Problem, QUOTA_EXCEEDED, QUOTA_TITLE};
pub use inflight::{Guard, InFlight, InFlightOptions};
pub use keys::{assert_same_slot, key_slot, make_key, make_key_with_prefix};
pub use lease::LeasedLimiter;
pub use metrics::Metrics;
pub use options::{Options, Strict};
pub use policy::{
    all_of, concurrency, fixed_window, sliding_counter, sliding_log, token_bucket, AllOf, Kind, Policy, Rule, MAX,
};
pub use request::{Backend, Call};
pub use reserve::Reservation;
pub use reservoir::Lease;
#[cfg(feature = "sentinel")]
pub use sentinel::SentinelConnection;
#[cfg(feature = "tower")]
pub use tower::{LimitedBody, RateLimitLayer, RateLimitService};
pub use transport::Connection;
