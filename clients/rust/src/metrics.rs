//! The counters of a [`RateLimit`](crate::RateLimit) (the names of
//! clients/DESIGN.md's metrics table): atomics the transport and the
//! limiters add to, read as one [`Metrics`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::breaker::{Counts, State};
use crate::decision::{Decision, Source};

/// The counters of a [`RateLimit`](crate::RateLimit) and its breaker's
/// state (the names of clients/DESIGN.md's metrics table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metrics {
    /// Decisions answered by the module.
    pub decisions_module: u64,
    /// … by the Lua twins.
    pub decisions_lua: u64,
    /// … from a lease reservoir.
    pub decisions_local: u64,
    /// … by panic limits.
    pub decisions_panic: u64,
    /// Decisions with `allowed` false (any source).
    pub denied: u64,
    /// Redis calls made (decisions, probes, refunds, detection).
    pub calls: u64,
    /// Calls that failed or timed out.
    pub failures: u64,
    /// Lease calls (leased limiters).
    pub leases: u64,
    /// Units leased.
    pub lease_tokens: u64,
    /// Callers that found their reservoir dry with a lease in flight and
    /// waited for it.
    pub lease_waits: u64,
    /// Refund calls.
    pub refunds: u64,
    /// Units given back by refunds.
    pub refund_tokens: u64,
    /// closed → open transitions.
    pub trips: u64,
    /// … by the consecutive-failures rule.
    pub trips_failures: u64,
    /// … by the latency rule.
    pub trips_latency: u64,
    /// Half-open probes that succeeded.
    pub probes_ok: u64,
    /// Half-open probes that failed.
    pub probes_failed: u64,
    /// The module's commands became unknown; the backend is detected again.
    pub redetects: u64,
    /// Strict mode: grants that WAIT did not see copied to enough replicas
    /// (failures, never grants).
    pub unreplicated: u64,
    /// The breaker's state.
    pub state: State,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) module: AtomicU64,
    pub(crate) lua: AtomicU64,
    pub(crate) local: AtomicU64,
    pub(crate) panic: AtomicU64,
    pub(crate) denied: AtomicU64,
    pub(crate) calls: AtomicU64,
    pub(crate) failures: AtomicU64,
    pub(crate) refunds: AtomicU64,
    pub(crate) refund_tokens: AtomicU64,
    pub(crate) redetects: AtomicU64,
    pub(crate) unreplicated: AtomicU64,
    pub(crate) leases: AtomicU64,
    pub(crate) lease_tokens: AtomicU64,
    pub(crate) lease_waits: AtomicU64,
}

impl Counters {
    /// Counts a decision by its source (and a denial), and passes it on.
    pub(crate) fn count(&self, d: Decision) -> Decision {
        let c = match d.source {
            Source::Module => &self.module,
            Source::Lua => &self.lua,
            Source::Local => &self.local,
            Source::Panic => &self.panic,
        };
        c.fetch_add(1, Relaxed);
        if !d.allowed {
            self.denied.fetch_add(1, Relaxed);
        }
        d
    }

    /// A refund call that gave `units` back.
    pub(crate) fn refunded(&self, units: u64) {
        self.refunds.fetch_add(1, Relaxed);
        self.refund_tokens.fetch_add(units, Relaxed);
    }

    /// The counters with the breaker's.
    pub(crate) fn snapshot(&self, b: Counts, state: State) -> Metrics {
        Metrics {
            decisions_module: self.module.load(Relaxed),
            decisions_lua: self.lua.load(Relaxed),
            decisions_local: self.local.load(Relaxed),
            decisions_panic: self.panic.load(Relaxed),
            denied: self.denied.load(Relaxed),
            calls: self.calls.load(Relaxed),
            failures: self.failures.load(Relaxed),
            leases: self.leases.load(Relaxed),
            lease_tokens: self.lease_tokens.load(Relaxed),
            lease_waits: self.lease_waits.load(Relaxed),
            refunds: self.refunds.load(Relaxed),
            refund_tokens: self.refund_tokens.load(Relaxed),
            trips: b.trips,
            trips_failures: b.trips_failures,
            trips_latency: b.trips_latency,
            probes_ok: b.probes_ok,
            probes_failed: b.probes_failed,
            redetects: self.redetects.load(Relaxed),
            unreplicated: self.unreplicated.load(Relaxed),
            state,
        }
    }
}
