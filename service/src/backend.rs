//! The backend: what decides a plan's parts. [`Backend`] is the one
//! question the service asks (decide these parts in one atomic call);
//! [`Redis`] answers it on the Rust client and owns everything the client
//! needs to: the one-call shortcut (a single fixed window is one
//! `RL.FIXEDWINDOW`, decided once, in `Redis::call_of`), the cache of
//! prepared calls, the error mapping and `PANIC_MODE`.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::RwLock;

use redis_ratelimit_client::{all_of, fixed_window, sliding_counter, sliding_log, token_bucket, Call, Connection, Decision};
use redis_ratelimit_client::{Error, Limiter, Panic, Policy, Source};

use crate::config::Algorithm;
use crate::error::ServiceError;
use crate::plan::{Part, PartState, Shape, MAX_LIMITED_DESCRIPTORS};
use crate::settings::PanicMode;
use crate::spread::{decide_across, groups, took, SlotCalls, Stats, Taken};
use ratelimit_core::catalogue::Kind;
use ratelimit_core::multi::{CHECK, SHADOW};

/// Decides parts together, all or nothing.
pub trait Backend {
    /// Decides `parts` (their keys ranges of `keys`) in one atomic call,
    /// `cost` 1 (each part by its weight and its flags: [`Shape::flags`])
    /// or 0 (check only); writes each part's [`PartState`] and whether it
    /// took its units ([`Part::taken`]), and answers whether the call was
    /// granted.
    fn decide(&self, keys: &str, parts: &mut [Part], cost: u64) -> impl Future<Output = Result<bool, ServiceError>> + Send;

    /// Gives back each part's weight (`REFUND`, never below zero: Envoy's
    /// `is_negative_hits`), one call per cluster slot; writes each part's
    /// state after it.
    fn refund(&self, keys: &str, parts: &mut [Part]) -> impl Future<Output = Result<(), ServiceError>> + Send;

    /// Takes each part's weight even past its limit (`FORCE`, a debit:
    /// usage reports), one call per cluster slot; writes each part's state
    /// after it.
    fn debit(&self, keys: &str, parts: &mut [Part]) -> impl Future<Output = Result<(), ServiceError>> + Send;
}

/// A prepared call: the client's limiter for one sequence of shapes.
struct Prepared<C> {
    limiter: Limiter<C>,
    /// One fixed window: one `RL.FIXEDWINDOW` (its weight the call's cost,
    /// its decision itself the part's state), else one `RL.MULTI`.
    single: bool,
}

impl<C> Clone for Prepared<C> {
    fn clone(&self) -> Self {
        Prepared { limiter: self.limiter.clone(), single: self.single }
    }
}

/// Shards of the cache: requests of different shapes take different locks.
const SHARDS: usize = 16;
/// Prepared calls kept per shard; a full shard drops one to take another.
const PER_SHARD: usize = 10_000 / SHARDS;

/// The prepared calls, by the shapes of their parts (what a call is built
/// from: algorithms, limits, windows, bursts and weights). The weights are
/// the requests' hits, so the set is not bounded by the configuration, and
/// a call's panic limits (`PANIC_MODE=local`) live in its limiter, so it
/// outlives configuration loads. Sharded by the shapes' hash, computed
/// once per request: a hit takes one shard's read lock (requests never
/// wait on one another but for a miss in their own shard), and a full
/// shard drops one entry to take another, never all.
struct Prepareds<V> {
    hasher: RandomState,
    shards: [RwLock<Shard<V>>; SHARDS],
}

/// One shard: the calls by their shapes' hash (a list per hash, for collisions).
type Shard<V> = HashMap<u64, Vec<(Vec<Shape>, V)>, BuildHasherDefault<Hashed>>;

/// The hasher of keys that are a hash already.
#[derive(Default)]
struct Hashed(u64);

impl Hasher for Hashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl<V: Clone> Prepareds<V> {
    fn new() -> Self {
        Prepareds { hasher: RandomState::new(), shards: std::array::from_fn(|_| RwLock::new(HashMap::default())) }
    }

    /// The call of `shapes`, prepared by `build` on a miss.
    fn get_or_build(&self, shapes: &[Shape], build: impl FnOnce() -> Result<V, ServiceError>) -> Result<V, ServiceError> {
        let h = self.hasher.hash_one(shapes);
        // bits the map does not use (its index takes the low ones, its tags the top 7)
        let shard = &self.shards[(h >> 32) as usize % SHARDS];
        let found = |m: &Shard<V>| m.get(&h).and_then(|l| l.iter().find(|(s, _)| s == shapes)).map(|(_, p)| p.clone());
        if let Some(p) = found(&shard.read().unwrap_or_else(|e| e.into_inner())) {
            return Ok(p);
        }
        let p = build()?;
        let mut map = shard.write().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = found(&map) {
            return Ok(p); // prepared meanwhile by another request: one limiter per shapes
        }
        if map.len() >= PER_SHARD {
            let old = map.keys().next().copied();
            if let Some(old) = old {
                map.remove(&old);
            }
        }
        map.entry(h).or_default().push((shapes.to_vec(), p.clone()));
        Ok(p)
    }
}

/// The [`Backend`] on Redis, through the Rust client.
pub struct Redis<C> {
    rl: redis_ratelimit_client::RateLimit<C>,
    panic_mode: PanicMode,
    prepared: Prepareds<Prepared<C>>,
    /// `REDIS_TYPE=cluster`: parts in several slots are decided per slot
    /// (crate::spread); else one call whatever the keys' slots.
    pub(crate) cluster: bool,
    /// What the cross-slot protocol did.
    pub(crate) spread: Stats,
}

impl<C: Connection> Redis<C> {
    /// A backend on the client `rl`, answering `panic_mode` while Redis is unavailable.
    pub fn new(rl: redis_ratelimit_client::RateLimit<C>, panic_mode: PanicMode) -> Redis<C> {
        Redis { rl, panic_mode, prepared: Prepareds::new(), cluster: false, spread: Default::default() }
    }

    /// On a Redis Cluster (`REDIS_TYPE=cluster`): parts across slots are
    /// decided per slot, reserved then refunded (crate::spread).
    pub fn on_cluster(mut self, cluster: bool) -> Redis<C> {
        self.cluster = cluster;
        self
    }

    /// What the cross-slot protocol did (`/metrics`).
    pub fn spread(&self) -> &Stats {
        &self.spread
    }

    /// The client (its counters are the service's `/metrics` too).
    pub fn client(&self) -> &redis_ratelimit_client::RateLimit<C> {
        &self.rl
    }

    /// The call of `parts`: their shapes looked up on the stack (a plan has
    /// at most [`MAX_LIMITED_DESCRIPTORS`] parts), prepared on a miss.
    fn prepared(&self, parts: &[Part]) -> Result<Prepared<C>, ServiceError> {
        let zero = Shape { algorithm: Algorithm(Kind::FixedWindow), limit: 0, window_ms: 0, burst: 0, weight: 0, flags: 0 };
        let mut buf = [zero; MAX_LIMITED_DESCRIPTORS];
        let Some(shapes) = buf.get_mut(..parts.len()) else {
            return Err(ServiceError::Invalid(format!("more than {MAX_LIMITED_DESCRIPTORS} limited descriptors")));
        };
        for (b, p) in shapes.iter_mut().zip(parts) {
            *b = p.shape;
        }
        let shapes: &[Shape] = shapes;
        self.prepared.get_or_build(shapes, || self.call_of(shapes))
    }

    /// The one place the shape of the call is chosen: one fixed window is
    /// `RL.FIXEDWINDOW` itself, its weight the call's cost (the same
    /// decision, for fewer instructions in Redis than a one-part
    /// `RL.MULTI`: make bench-envoy); anything else one `RL.MULTI`.
    fn call_of(&self, shapes: &[Shape]) -> Result<Prepared<C>, ServiceError> {
        let inv = |e: Error| ServiceError::Invalid(e.to_string());
        let mut policies = Vec::with_capacity(shapes.len());
        for (i, s) in shapes.iter().enumerate() {
            // `requests_per_unit: 0`: a limit of 1 that each call asks 2 of, never fits
            let (p, w) = if s.limit == 0 { (Shape { limit: 1, burst: 1, ..*s }, 2) } else { (*s, s.weight) };
            let mut p = policy(&format!("d{i}"), &p).and_then(|p| p.weighted(w)).map_err(inv)?;
            if s.flags & CHECK != 0 {
                p = p.checked();
            }
            if s.flags & SHADOW != 0 {
                p = p.shadowed();
            }
            policies.push(p);
        }
        let panic = match self.panic_mode {
            PanicMode::Local(instances) => Panic::Instances(instances),
            _ => Panic::default(),
        };
        // (a CHECK part alone: its call with cost 0; a SHADOW part alone takes
        // when it fits, as RL.FIXEDWINDOW does)
        let (limiter, single) =
            if let [Shape { algorithm: Algorithm(Kind::FixedWindow), limit: limit @ 1.., window_ms, .. }] = *shapes {
                (self.rl.limiter(fixed_window("d0", limit, window_ms, false).map_err(inv)?, panic), true)
            } else {
                (self.rl.limiter(all_of(policies, Some("envoy")).map_err(inv)?, panic), false)
            };
        Ok(Prepared { limiter: limiter.map_err(inv)?, single })
    }
}

/// The key of a part in the request's `keys`.
fn key_of<'k>(keys: &'k str, p: &Part) -> &'k str {
    keys.get(p.key.clone()).unwrap_or_default()
}

/// The client's policy of one shape (its weight not yet applied).
fn policy(name: &str, s: &Shape) -> redis_ratelimit_client::Result<Policy> {
    match s.algorithm {
        Algorithm(Kind::FixedWindow) => fixed_window(name, s.limit, s.window_ms, false),
        Algorithm(Kind::TokenBucket) => token_bucket(name, s.burst, s.limit, s.window_ms),
        Algorithm(Kind::SlidingLog) => sliding_log(name, s.limit, s.window_ms),
        Algorithm(Kind::SlidingCounter) => sliding_counter(name, s.limit, s.window_ms),
        // `Algorithm::parse` never makes one.
        Algorithm(Kind::Concurrency) => {
            Err(redis_ratelimit_client::Error::Unsupported("the service has no concurrency limits".into()))
        }
    }
}

impl<C: Connection> Backend for Redis<C> {
    async fn decide(&self, keys: &str, parts: &mut [Part], cost: u64) -> Result<bool, ServiceError> {
        if self.cluster && parts.len() > 1 {
            if let Some(groups) = groups(keys, parts) {
                return decide_across(self, keys, parts, cost, groups).await;
            }
        }
        let (d, single) = self.call(keys, parts, cost).await?;
        self.read(&d, single, parts)
    }

    async fn refund(&self, keys: &str, parts: &mut [Part]) -> Result<(), ServiceError> {
        for p in parts.iter_mut() {
            p.taken = true; // give_back refunds the parts that took
        }
        for (g, mut each) in self.slot_groups(keys, parts) {
            let ok = self.give_back(keys, &mut each).await;
            put_back(parts, &g, each);
            if !ok {
                return Err(ServiceError::Unavailable("the refund (is_negative_hits) failed: Redis is unavailable".into()));
            }
        }
        Ok(())
    }

    async fn debit(&self, keys: &str, parts: &mut [Part]) -> Result<(), ServiceError> {
        for (g, mut each) in self.slot_groups(keys, parts) {
            let (d, single) = self.call_with(keys, &each, Call::debit(1)).await?;
            self.read(&d, single, &mut each)?;
            put_back(parts, &g, each);
        }
        Ok(())
    }
}

/// Writes each part of a slot group (`g`: their indices) back into `parts`.
fn put_back(parts: &mut [Part], g: &[usize], each: Vec<Part>) {
    for (&i, p) in g.iter().zip(each) {
        if let Some(x) = parts.get_mut(i) {
            *x = p;
        }
    }
}

impl<C: Connection> SlotCalls for Redis<C> {
    async fn take(&self, keys: &str, parts: &mut [Part], cost: u64) -> Result<Taken, ServiceError> {
        let (d, single) = self.call(keys, parts, cost).await?;
        let allowed = self.read(&d, single, parts)?;
        Ok(Taken { allowed, took: took(&d, parts) })
    }

    /// `REFUND 1` (`WEIGHT` per part) on the keys of the parts that took
    /// (a refund has no CHECK or SHADOW: they are dropped), or the single
    /// fixed window's weight; those parts say what is left after it, and
    /// that they hold nothing.
    async fn give_back(&self, keys: &str, parts: &mut [Part]) -> bool {
        let idx: Vec<usize> = (0..parts.len()).filter(|&i| parts[i].taken).collect();
        let mut back: Vec<Part> = idx.iter().map(|&i| parts[i].clone()).collect();
        for p in &mut back {
            p.shape.flags = 0;
        }
        if back.is_empty() {
            return true;
        }
        let Ok(call) = self.prepared(&back) else { return false };
        let d = match (call.single, &*back) {
            (true, [p]) => call.limiter.refund(key_of(keys, p), p.shape.weight).await,
            _ => {
                let keys: Vec<&str> = back.iter().map(|p| key_of(keys, p)).collect();
                call.limiter.refund_keys(&keys, 1).await
            }
        };
        let Ok(d) = d else { return false };
        let ok = self.read(&d, call.single, &mut back).is_ok();
        for (&i, p) in idx.iter().zip(&back) {
            (parts[i].state, parts[i].taken) = (p.state, false);
        }
        ok
    }

    fn stats(&self) -> &Stats {
        &self.spread
    }
}

impl<C: Connection> Redis<C> {
    /// `parts` as calls that need not be atomic together (refunds, debits)
    /// make them: one group per cluster slot, or all of them in one.
    fn slot_groups(&self, keys: &str, parts: &[Part]) -> Vec<(Vec<usize>, Vec<Part>)> {
        let groups = if self.cluster { groups(keys, parts) } else { None };
        let groups = groups.unwrap_or_else(|| vec![(0..parts.len()).collect()]);
        groups
            .into_iter()
            .map(|g| {
                let each = g.iter().filter_map(|&i| parts.get(i).cloned()).collect();
                (g, each)
            })
            .collect()
    }

    /// The one call of `parts` (one slot on a cluster): the client's
    /// decision, and whether it is a single `RL.FIXEDWINDOW`'s.
    async fn call(&self, keys: &str, parts: &[Part], cost: u64) -> Result<(Decision, bool), ServiceError> {
        self.call_with(keys, parts, Call::cost(cost)).await
    }

    /// [`Redis::call`] with the call's options (`FORCE` for a debit).
    async fn call_with(&self, keys: &str, parts: &[Part], options: Call) -> Result<(Decision, bool), ServiceError> {
        let call = self.prepared(parts)?;
        let d = match (call.single, parts) {
            (true, [p]) => {
                let cost = if options.cost == 0 || p.shape.flags & CHECK != 0 { 0 } else { p.shape.weight };
                call.limiter.limit(key_of(keys, p), Call { cost, ..options }).await
            }
            _ => {
                let keys: Vec<&str> = parts.iter().map(|p| key_of(keys, p)).collect();
                if self.cluster {
                    call.limiter.limit_keys(&keys, options).await
                } else {
                    // one server holds every slot: one call, whatever the keys' slots
                    call.limiter.limit_keys_any_slot(&keys, options).await
                }
            }
        };
        let d = d.map_err(|e| match e {
            Error::Unavailable(m) => ServiceError::Unavailable(m),
            Error::Invalid(m) => ServiceError::Invalid(m),
            // parts are grouped by slot first (crate::spread), so this is a
            // bug here: an error answer, and nothing was counted (refused before any call)
            Error::CrossSlot(m) => {
                ServiceError::Internal(format!("the keys of one call span cluster slots, nothing counted: {m}"))
            }
            e => ServiceError::Internal(e.to_string()),
        })?;
        Ok((d, call.single))
    }
}

impl<C> Redis<C> {
    /// Each part's state from the client's decision (a single
    /// `RL.FIXEDWINDOW`'s decision itself, else its parts), with
    /// `PANIC_MODE` applied when Redis did not decide. Whether all took
    /// their units.
    fn read(&self, d: &Decision, single: bool, parts: &mut [Part]) -> Result<bool, ServiceError> {
        // (retry_after_ms, remaining) in place of Redis's while it is unavailable
        let panic: Option<fn(u64) -> (i64, u64)> = match (d.source, self.panic_mode) {
            (Source::Panic, PanicMode::Error) => {
                return Err(ServiceError::Unavailable(
                    "Redis is unavailable (no reply within REDIS_TIMEOUT, or the breaker is open)".into(),
                ))
            }
            (Source::Panic, PanicMode::Allow) => Some(|limit| (0, limit)),
            (Source::Panic, PanicMode::Deny) => Some(|_| (1, 0)),
            // the client's panic limits decided, all parts or none
            _ => None,
        };
        let from_redis = matches!(d.source, Source::Module | Source::Lua);
        let state = |limit: u64, retry_ms: i64, remaining: u64, reset_ms: u64| {
            let (retry_ms, remaining) = panic.map_or((retry_ms, remaining), |f| f(limit));
            PartState { over: retry_ms != 0, remaining, retry_ms, reset_ms, redis: panic.is_none() && from_redis }
        };
        // whether a part took its units: from Redis's (or the client's
        // panic limits') answer; PANIC_MODE allow: every part but a check
        let taken = |p: &Part, granted: u64| match (d.source, self.panic_mode) {
            (Source::Panic, PanicMode::Allow) => p.shape.flags & CHECK == 0,
            (Source::Panic, PanicMode::Deny) => false,
            _ => granted > 0,
        };
        if single {
            if let Some(p) = parts.first_mut() {
                p.state = state(d.limit, d.retry_after_ms, d.remaining, d.reset_after_ms);
                p.taken = taken(p, d.granted);
            }
        } else {
            for (p, x) in parts.iter_mut().zip(&d.parts) {
                p.state = state(x.limit, x.retry_after_ms, x.remaining, x.reset_after_ms);
                p.taken = taken(p, x.granted);
            }
        }
        Ok(match (d.source, self.panic_mode) {
            (Source::Panic, PanicMode::Allow) => true,
            (Source::Panic, PanicMode::Deny) => false,
            _ => d.allowed,
        })
    }
}

#[cfg(test)]
mod tests {
    //! The cache of prepared calls, on numbers in place of limiters.
    use super::*;

    fn shapes(i: u64) -> Vec<Shape> {
        vec![Shape { algorithm: Algorithm(Kind::FixedWindow), limit: i, window_ms: 1000, burst: i, weight: 1, flags: 0 }]
    }

    #[test]
    fn a_hit_builds_nothing_and_a_full_shard_drops_one_entry() {
        let cache: Prepareds<u64> = Prepareds::new();
        assert_eq!(cache.get_or_build(&shapes(1), || Ok(1)), Ok(1));
        assert_eq!(cache.get_or_build(&shapes(1), || panic!("built twice")), Ok(1));
        assert_ne!(shapes(1), shapes(2));
        assert_eq!(cache.get_or_build(&shapes(2), || Ok(2)), Ok(2));
        // 20,000 more shapes: each shard stays at its bound, and entries are dropped one at a time
        let total = |c: &Prepareds<u64>| c.shards.iter().map(|s| s.read().unwrap().len()).sum::<usize>();
        for i in 3..20_003 {
            let before = total(&cache);
            cache.get_or_build(&shapes(i), || Ok(i)).unwrap();
            let after = total(&cache);
            assert!(after == before || after == before + 1, "{before} -> {after}: at most one dropped");
        }
        assert!(cache.shards.iter().all(|s| s.read().unwrap().len() == PER_SHARD));
        // the newest is kept
        assert_eq!(cache.get_or_build(&shapes(20_002), || panic!("dropped")), Ok(20_002));
        // an error builds nothing
        assert!(cache.get_or_build(&shapes(0), || Err(ServiceError::Invalid("no".into()))).is_err());
        assert_eq!(cache.get_or_build(&shapes(0), || Ok(7)), Ok(7));
    }
}
