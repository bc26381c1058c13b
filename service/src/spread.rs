//! A domain's keys spread over a Redis Cluster, and a request whose parts
//! land in several slots decided without over-admission.
//!
//! **Hash tags** ([`crate::plan`] writes them): a key has none by default,
//! so the cluster hashes it whole and a domain's counters spread as
//! envoyproxy/ratelimit's do. A domain's `hash_tag_key: user` (a file's
//! top-level extension key) writes the entry `user_<value>` of each
//! descriptor that has it as `{user_<value>}`: one user's limits share a
//! slot, users spread. Checked at load (crate::config).
//!
//! **Reserve, then refund** (`decide_across`): on a cluster
//! (`REDIS_TYPE=cluster`), parts in several slots are grouped by slot and
//! each group is one atomic call (one `RL.MULTI`, or one `RL.FIXEDWINDOW`),
//! all groups at the same time. If every group took its units, the request
//! is allowed. If any group denied (or failed), the groups that took give
//! their units back (`REFUND 1`: `WEIGHT` units per part). So no part
//! ever holds units of a denied request for longer than the take → refund
//! window ([`Stats`]; docs/envoy.md, "Across cluster slots"), and no
//! request passes that a part denied. Single server and Sentinel: one call
//! per request, whatever the keys' slots (crate::backend).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::task::Poll;
use std::time::{Duration, Instant};

use redis_ratelimit_client::{key_slot, Decision, Source};

use crate::error::ServiceError;
use crate::plan::{Part, MAX_LIMITED_DESCRIPTORS};

/// What [`decide_across`] asks of the backend (crate::backend's `Redis`).
pub(crate) trait SlotCalls: Sync {
    /// One atomic call of `parts` (one slot), their states and what each
    /// took written: whether the group allowed, whether Redis holds units of it.
    fn take(&self, keys: &str, parts: &mut [Part], cost: u64) -> impl Future<Output = Result<Taken, ServiceError>> + Send;
    /// Gives back what [`SlotCalls::take`] took (the parts that took, each
    /// its units), their states written after it; whether it was given back.
    fn give_back(&self, keys: &str, parts: &mut [Part]) -> impl Future<Output = bool> + Send;
    /// Where to count.
    fn stats(&self) -> &Stats;
}

/// What one group's call did.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Taken {
    /// Every part of the group took its units.
    pub allowed: bool,
    /// Redis holds units of it: some part took (not a check, not a shadow
    /// part over its limit) and Redis decided (not the panic limits).
    pub took: bool,
}

/// Whether Redis holds units of a call whose parts say what they took.
pub(crate) fn took(d: &Decision, parts: &[Part]) -> bool {
    matches!(d.source, Source::Module | Source::Lua) && parts.iter().any(|p| p.taken)
}

/// The parts' indices grouped by their keys' slots, in order of first
/// appearance; `None` when all share one slot (one call, as on one server).
pub(crate) fn groups(keys: &str, parts: &[Part]) -> Option<Vec<Vec<usize>>> {
    let mut slots = [0u16; MAX_LIMITED_DESCRIPTORS];
    for (s, p) in slots.iter_mut().zip(parts) {
        *s = key_slot(keys.get(p.key.clone()).unwrap_or_default());
    }
    let slots = slots.get(..parts.len())?;
    let first = *slots.first()?;
    if slots.iter().all(|&s| s == first) {
        return None;
    }
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, &s) in slots.iter().enumerate() {
        match groups.iter_mut().find(|g| g.0 == s) {
            Some(g) => g.1.push(i),
            None => groups.push((s, vec![i])),
        }
    }
    Some(groups.into_iter().map(|g| g.1).collect())
}

/// What the reserve-then-refund protocol did, for `/metrics` and the bench.
#[derive(Default)]
pub struct Stats {
    /// Requests decided across slots.
    pub across: AtomicU64,
    /// Groups that took and were refunded (a group denied elsewhere).
    pub refunds: AtomicU64,
    /// Refunds that failed: their units stay taken until their windows end.
    pub refund_failures: AtomicU64,
    /// The take → refund windows in µs (the last [`WINDOWS_KEPT`]): from
    /// the takes sent to the refunds answered, an upper bound of the time
    /// the units were held.
    windows: Mutex<(Vec<u32>, usize)>,
}

/// Windows kept for the quantiles.
pub const WINDOWS_KEPT: usize = 1 << 16;

impl Stats {
    fn record(&self, d: Duration) {
        let us = u32::try_from(d.as_micros()).unwrap_or(u32::MAX);
        let mut w = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let (v, next) = &mut *w;
        if v.len() < WINDOWS_KEPT {
            v.push(us);
        } else if let Some(slot) = v.get_mut(*next % WINDOWS_KEPT) {
            *slot = us;
        }
        *next = next.wrapping_add(1);
    }

    /// The take → refund window's quantiles `qs` (0 to 1) in µs, over the
    /// kept windows; empty before any refund.
    pub fn window_quantiles_us(&self, qs: &[f64]) -> Vec<u32> {
        let mut v = self.windows.lock().unwrap_or_else(|e| e.into_inner()).0.clone();
        if v.is_empty() {
            return Vec::new();
        }
        v.sort_unstable();
        let last = v.len() - 1;
        qs.iter().map(|q| v[((q.clamp(0.0, 1.0) * last as f64).round() as usize).min(last)]).collect()
    }

    /// The Prometheus text of these figures.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        for (name, help, v) in [
            ("redis_ratelimit_cross_slot_requests", "Requests whose parts span cluster slots.", &self.across),
            ("redis_ratelimit_cross_slot_refunds", "Slot groups refunded: another group denied.", &self.refunds),
            (
                "redis_ratelimit_cross_slot_refund_failures",
                "Refunds that failed (units held until their window ends).",
                &self.refund_failures,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", v.load(Relaxed));
        }
        let name = "redis_ratelimit_cross_slot_refund_window_seconds";
        let _ = writeln!(out, "# HELP {name} Take to refund, over the last {WINDOWS_KEPT} refunds.\n# TYPE {name} summary");
        let qs = [0.5, 0.99];
        for (q, us) in qs.iter().zip(self.window_quantiles_us(&qs)) {
            let _ = writeln!(out, "{name}{{quantile=\"{q}\"}} {}", f64::from(us) / 1e6);
        }
        out
    }
}

/// Every future of `fs` run at the same time; their outputs in order.
async fn join_all<F: Future>(fs: Vec<F>) -> Vec<F::Output> {
    let mut fs: Vec<Pin<Box<F>>> = fs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = fs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in fs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// [`crate::backend::Backend::decide`] of parts in several slots
/// (`groups`, from [`groups`]): each group one atomic call, all at once;
/// when any denies or fails, the groups that took are refunded. Whether
/// every part took its units.
pub(crate) async fn decide_across<S: SlotCalls>(
    s: &S,
    keys: &str,
    parts: &mut [Part],
    cost: u64,
    groups: Vec<Vec<usize>>,
) -> Result<bool, ServiceError> {
    s.stats().across.fetch_add(1, Relaxed);
    let t0 = Instant::now();
    let mut each: Vec<Vec<Part>> =
        groups.iter().map(|g| g.iter().filter_map(|&i| parts.get(i).cloned()).collect()).collect();
    let got = join_all(each.iter_mut().map(|g| s.take(keys, g, cost)).collect()).await;
    let allowed = got.iter().all(|x| matches!(x, Ok(Taken { allowed: true, .. })));
    if !allowed {
        let mut refunds = Vec::new();
        for (g, x) in each.iter_mut().zip(&got) {
            if let Ok(Taken { took: true, .. }) = x {
                refunds.push(s.give_back(keys, g));
            }
        }
        if !refunds.is_empty() {
            let done = join_all(refunds).await;
            s.stats().record(t0.elapsed());
            s.stats().refunds.fetch_add(done.len() as u64, Relaxed);
            let failed = done.iter().filter(|ok| !**ok).count() as u64;
            s.stats().refund_failures.fetch_add(failed, Relaxed);
        }
    }
    for (g, states) in groups.iter().zip(&each) {
        for (&i, p) in g.iter().zip(states) {
            if let Some(x) = parts.get_mut(i) {
                (x.state, x.taken) = (p.state, p.taken);
            }
        }
    }
    match got.into_iter().find_map(Result::err) {
        Some(e) => Err(e),
        None => Ok(allowed),
    }
}
