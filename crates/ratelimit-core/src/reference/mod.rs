//! Reference models: one per algorithm, and the RL.MULTI combiner, used by
//! every Rust test layer (this crate's unit and property tests, RL.MULTI's
//! model tests and the fuzz targets in `fuzz/`).
//!
//! Each model is an independent, brute-force statement of docs/contract.md: exact
//! integers and rationals, plain lists and searches, never a call into the
//! implementation it checks (it only reads a state's fields to start from
//! it). Where the implementation uses a closed form, the model searches:
//!
//! - [`tokenbucket::Bucket`]: the level as an exact rational, refilled
//!   linearly; waits are the deficit divided by the rate.
//! - [`slidinglog::Log`]: a plain list of `(time, units)`; sums over the
//!   entries in the window; waits walk the list to the entry whose expiry
//!   frees enough units.
//! - [`slidingcounter`]: the estimate `prev × (W − e) / W + cur` compared as
//!   an exact rational; every answer found by a linear scan or a bisection.
//! - [`fixedwindow`]: whether the stored window holds an instant, stated
//!   directly; grants and `remaining` the largest fit, waits the first
//!   millisecond that fits, all searched.
//! - [`concurrency`]: a map from id hash to `(units, expiry)`; every wait
//!   the first of the instants at which a lease lapses that fits, tried in
//!   order.
//! - [`multi`]: each limit on its own, then the largest common grant, all
//!   or nothing, and the whole reply by the words of docs/contract.md.
//!
//! Compiled for tests, or for other crates with the `reference` feature
//! (`fuzz/` enables it). Models may panic on inputs outside the documented
//! ranges (that is a failed test), never overflow inside them.

#[cfg(test)]
mod agreement;
pub mod concurrency;
pub mod fixedwindow;
pub mod gcra;
pub mod multi;
pub mod slidingcounter;
pub mod slidinglog;
pub mod tokenbucket;

/// Microseconds to whole milliseconds, rounded up, saturating like the
/// reply's integers.
pub fn ceil_ms(us: u128) -> u64 {
    u64::try_from(us.div_ceil(1000)).unwrap_or(u64::MAX)
}

/// A wait in milliseconds as the reply's signed integer (saturating).
pub fn wait_i64(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}
