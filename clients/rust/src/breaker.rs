//! The circuit breaker of one `RateLimit`, and the panic limits that decide
//! while it is open.
//!
//! closed → open after `failures` consecutive failures, or when the p95 of
//! the last `latency_window` call latencies stays above `latency_budget_ms`
//! for `latency_period_ms`. Open: no calls for `open_ms`, then half-open:
//! exactly one probe; its success closes the breaker, its failure opens it
//! again for `open_ms`.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::policy::{check_int, Policy};

/// The breaker's settings (the defaults of clients/DESIGN.md).
#[derive(Debug, Clone, PartialEq)]
pub struct Breaker {
    /// Consecutive failures that open it (default 5).
    pub failures: u32,
    /// The p95 latency budget in ms (default 50).
    pub latency_budget_ms: f64,
    /// How long the p95 must stay above the budget to open it (default 1000 ms).
    pub latency_period_ms: f64,
    /// How many latencies the p95 is taken over (default 64).
    pub latency_window: usize,
    /// How long it stays open before a probe (default 1000 ms).
    pub open_ms: f64,
}

impl Default for Breaker {
    fn default() -> Breaker {
        Breaker { failures: 5, latency_budget_ms: 50.0, latency_period_ms: 1000.0, latency_window: 64, open_ms: 1000.0 }
    }
}

impl Breaker {
    pub(crate) fn check(&self) -> Result<()> {
        if self.failures < 1 || self.latency_window < 1 {
            return Err(Error::Invalid("breaker: failures and latency_window must be >= 1".into()));
        }
        for (k, v) in [
            ("latency_budget_ms", self.latency_budget_ms),
            ("latency_period_ms", self.latency_period_ms),
            ("open_ms", self.open_ms),
        ] {
            if !(v >= 0.0 && v.is_finite()) {
                return Err(Error::Invalid(format!("breaker: {k} must be a number >= 0")));
            }
        }
        Ok(())
    }
}

/// The breaker's state, as `metrics().state` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Calls go to Redis.
    Closed,
    /// No calls; panic limits decide.
    Open,
    /// One probe is out; everyone else gets the panic limits.
    HalfOpen,
}

impl State {
    /// `"closed"`, `"open"` or `"half_open"`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
        }
    }
}

/// May a call go out now?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permit {
    No,
    Yes,
    Probe,
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counts {
    pub trips: u64,
    pub trips_failures: u64,
    pub trips_latency: u64,
    pub probes_ok: u64,
    pub probes_failed: u64,
}

#[derive(Debug)]
struct Inner {
    state: State,
    consecutive: u32,
    samples: VecDeque<f64>,
    above_since: Option<f64>,
    opened_at: f64,
    counts: Counts,
}

/// The breaker's running state (times in ms on one monotonic clock).
#[derive(Debug)]
pub(crate) struct BreakerState {
    cfg: Breaker,
    inner: Mutex<Inner>,
}

impl BreakerState {
    pub fn new(cfg: Breaker) -> BreakerState {
        let inner = Inner {
            state: State::Closed,
            consecutive: 0,
            samples: VecDeque::with_capacity(cfg.latency_window),
            above_since: None,
            opened_at: 0.0,
            counts: Counts::default(),
        };
        BreakerState { cfg, inner: Mutex::new(inner) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // a panic while holding it leaves consistent counters: go on
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn state(&self) -> State {
        self.lock().state
    }

    pub fn counts(&self) -> Counts {
        self.lock().counts
    }

    pub fn acquire(&self, now: f64) -> Permit {
        let mut s = self.lock();
        match s.state {
            State::Closed => Permit::Yes,
            State::HalfOpen => Permit::No,
            State::Open if now - s.opened_at < self.cfg.open_ms => Permit::No,
            State::Open => {
                s.state = State::HalfOpen;
                Permit::Probe
            }
        }
    }

    /// Would `acquire(now)` refuse? (No state change.)
    pub fn refuses(&self, now: f64) -> bool {
        let s = self.lock();
        match s.state {
            State::Closed => false,
            State::HalfOpen => true,
            State::Open => now - s.opened_at < self.cfg.open_ms,
        }
    }

    pub fn success(&self, latency_ms: f64, now: f64, probe: bool) {
        let mut s = self.lock();
        if probe {
            s.counts.probes_ok += 1;
            s.state = State::Closed;
            s.consecutive = 0;
            s.samples.clear();
            s.above_since = None;
            return;
        }
        s.consecutive = 0;
        if s.samples.len() == self.cfg.latency_window {
            s.samples.pop_front();
        }
        s.samples.push_back(latency_ms);
        if s.state != State::Closed {
            return;
        }
        if latency_ms <= self.cfg.latency_budget_ms && s.above_since.is_none() {
            return; // fast path: a fast call while nothing is slow
        }
        let n = s.samples.len();
        let mut v: Vec<f64> = s.samples.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        let p95 = v[(95 * n).div_ceil(100).clamp(1, n) - 1];
        if p95 <= self.cfg.latency_budget_ms {
            s.above_since = None;
        } else {
            let since = *s.above_since.get_or_insert(now);
            if now - since >= self.cfg.latency_period_ms {
                trip(&mut s, now, false);
            }
        }
    }

    pub fn failure(&self, now: f64, probe: bool) {
        let mut s = self.lock();
        if probe {
            s.counts.probes_failed += 1;
            s.state = State::Open;
            s.opened_at = now;
            return;
        }
        s.consecutive += 1;
        if s.state == State::Closed && s.consecutive >= self.cfg.failures {
            trip(&mut s, now, true);
        }
    }
}

fn trip(s: &mut Inner, now: f64, failures: bool) {
    s.counts.trips += 1;
    if failures {
        s.counts.trips_failures += 1;
    } else {
        s.counts.trips_latency += 1;
    }
    s.state = State::Open;
    s.opened_at = now;
    s.consecutive = 0;
    s.samples.clear();
    s.above_since = None;
}

/// Panic limits: what decides per key while Redis is unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Panic {
    /// The policy's limit divided by `instances` (≥ 1) over its window.
    Instances(u64),
    /// A fixed per-key ceiling per window (`window_ms`: the policy's when `None`).
    Fixed {
        /// The ceiling.
        limit: u64,
        /// The window; the policy's when `None`.
        window_ms: Option<u64>,
    },
}

impl Default for Panic {
    fn default() -> Panic {
        Panic::Instances(1)
    }
}

impl Panic {
    pub(crate) fn check(&self) -> Result<()> {
        match *self {
            Panic::Instances(n) => check_int("panic instances", n, 1).map(|_| ()),
            Panic::Fixed { limit, window_ms } => {
                check_int("panic limit", limit, 1)?;
                if let Some(w) = window_ms {
                    check_int("panic window_ms", w, 1)?;
                }
                Ok(())
            }
        }
    }

    /// The panic limit for a policy.
    pub fn capacity(&self, p: &Policy) -> u64 {
        match *self {
            Panic::Instances(n) => (p.limit() / n.max(1)).max(1),
            Panic::Fixed { limit, .. } => limit,
        }
    }

    /// The window the panic limit refills over.
    pub fn window(&self, p: &Policy) -> u64 {
        match *self {
            Panic::Fixed { window_ms: Some(w), .. } => w,
            _ => p.window_ms(),
        }
    }
}

/// One part's answer from the panic buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PanicPart {
    pub took: u64,
    pub cap: u64,
    pub remaining: u64,
    pub retry_ms: i64,
    pub reset_ms: u64,
}

/// (key, part index) → (tokens, at ms).
type Buckets = HashMap<(String, usize), (f64, f64)>;

/// The local buckets of one limiter's panic limits (bounded; the oldest
/// key is dropped first).
#[derive(Debug)]
pub(crate) struct PanicBuckets {
    shape: Vec<(u64, f64)>, // per part: capacity, ms per token
    max_keys: usize,
    inner: Mutex<(Buckets, VecDeque<(String, usize)>)>,
}

impl PanicBuckets {
    pub fn new(panic: &Panic, parts: &[Policy], max_keys: usize) -> PanicBuckets {
        let shape = parts
            .iter()
            .map(|p| {
                let cap = panic.capacity(p);
                (cap, panic.window(p) as f64 / cap as f64)
            })
            .collect();
        PanicBuckets { shape, max_keys: max_keys.max(1), inner: Mutex::new((HashMap::new(), VecDeque::new())) }
    }

    /// The largest g ≤ cost (all or nothing unless partial) that every part
    /// can take g × weight of; one answer per part.
    pub fn decide<K: AsRef<str>>(
        &self,
        keys: &[K],
        cost: u64,
        weights: &[u64],
        partial: bool,
        dry_run: bool,
        now: f64,
    ) -> Vec<PanicPart> {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = &mut *guard;
        let mut tokens = Vec::with_capacity(keys.len());
        for (i, k) in keys.iter().enumerate() {
            let (cap, ms) = self.shape[i];
            let id = (k.as_ref().to_owned(), i);
            let b = match map.get_mut(&id) {
                Some(b) => {
                    if now > b.1 {
                        b.0 = (b.0 + (now - b.1) / ms).min(cap as f64);
                        b.1 = now;
                    }
                    b.0
                }
                None => {
                    if map.len() >= self.max_keys {
                        if let Some(old) = order.pop_front() {
                            map.remove(&old);
                        }
                    }
                    map.insert(id.clone(), (cap as f64, now));
                    order.push_back(id);
                    cap as f64
                }
            };
            tokens.push(b);
        }
        let mut g = cost;
        for (t, &w) in tokens.iter().zip(weights) {
            g = g.min(((t + 1e-9).floor() as u64) / w.max(1));
        }
        if g < cost && !partial {
            g = 0;
        }
        let mut out = Vec::with_capacity(keys.len());
        for (i, k) in keys.iter().enumerate() {
            let (cap, ms) = self.shape[i];
            let w = weights[i];
            let u = g.saturating_mul(w);
            let c = cost.saturating_mul(w);
            let before = tokens[i];
            let alone = before + 1e-9 >= c as f64;
            let left = before - u as f64;
            if !dry_run {
                if let Some(b) = map.get_mut(&(k.as_ref().to_owned(), i)) {
                    b.0 = left;
                }
            }
            let retry_ms = if g == cost || alone {
                0
            } else if c > cap {
                -1
            } else {
                (((c as f64 - left) * ms).ceil() as i64).max(1)
            };
            let reset_ms = ((cap as f64 - left) * ms).ceil().max(0.0) as u64;
            out.push(PanicPart { took: u, cap, remaining: (left + 1e-9).floor().max(0.0) as u64, retry_ms, reset_ms });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_failures_and_probes_once() {
        let b = BreakerState::new(Breaker { failures: 3, open_ms: 100.0, ..Breaker::default() });
        for _ in 0..2 {
            b.failure(0.0, false);
        }
        assert_eq!(b.state(), State::Closed);
        b.success(1.0, 0.0, false); // resets the run
        for _ in 0..3 {
            b.failure(1.0, false);
        }
        assert_eq!(b.state(), State::Open);
        assert_eq!(b.acquire(50.0), Permit::No);
        assert_eq!(b.acquire(101.0), Permit::Probe);
        assert_eq!(b.acquire(101.0), Permit::No);
        b.failure(102.0, true);
        assert_eq!(b.state(), State::Open);
        assert_eq!(b.acquire(150.0), Permit::No);
        assert_eq!(b.acquire(202.0), Permit::Probe);
        b.success(1.0, 203.0, true);
        assert_eq!(b.acquire(203.0), Permit::Yes);
        let c = b.counts();
        assert_eq!((c.trips, c.trips_failures, c.probes_ok, c.probes_failed), (1, 1, 1, 1));
    }

    #[test]
    fn opens_on_slow_p95_held_for_the_period() {
        let b = BreakerState::new(Breaker { latency_budget_ms: 10.0, latency_period_ms: 100.0, ..Breaker::default() });
        for i in 0..10 {
            b.success(20.0, i as f64 * 10.0, false);
        }
        assert_eq!(b.state(), State::Closed);
        b.success(20.0, 100.0, false);
        assert_eq!(b.state(), State::Open);
        assert_eq!(b.counts().trips_latency, 1);
    }

    #[test]
    fn panic_buckets_never_grant_more_than_the_panic_limit() {
        let p = crate::policy::token_bucket("p", 10, 10, 1000).unwrap();
        let pb = PanicBuckets::new(&Panic::Instances(2), std::slice::from_ref(&p), 10);
        let k = vec!["k".to_string()];
        let got: u64 = (0..10).map(|_| pb.decide(&k, 1, &[1], false, false, 0.0)[0].took).sum();
        assert_eq!(got, 5);
        let d = pb.decide(&k, 1, &[1], false, false, 0.0)[0];
        assert_eq!((d.cap, d.remaining, d.retry_ms), (5, 0, 200));
        assert_eq!(pb.decide(&k, 6, &[1], false, false, 0.0)[0].retry_ms, -1);
        assert_eq!(pb.decide(&k, 1, &[1], false, false, 200.0)[0].took, 1);
    }
}
