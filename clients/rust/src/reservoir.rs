//! The leased limiters' I/O-free half (the Python client's `lease.py`):
//! their settings, one reservoir per key (LRU-bounded, swept when idle),
//! what a lease's reply does to a reservoir, and the decisions a reservoir
//! answers. `lease.rs` sends the leases and refunds.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::answer;
use crate::breaker::{Panic, PanicBuckets};
use crate::decision::{Decision, Source};
use crate::error::{Error, Result};
use crate::policy::{check_int, Policy, Rule};
use crate::request::Call;

/// The settings of a leased limiter (the defaults of clients/DESIGN.md).
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    /// Units asked for per lease (default 50).
    pub batch: u64,
    /// A refill starts when the reservoir drops below `low_water × batch` (default 0.2).
    pub low_water: f64,
    /// At most this many keys (LRU; default 10 000).
    pub max_keys: usize,
    /// A key unused this long gives its units back (default 5000 ms).
    pub idle_ms: u64,
    /// After a short lease, no lease for `min(retry_after_ms, recheck_ms)` (default 250 ms).
    pub recheck_ms: u64,
    /// The panic limits once a reservoir is empty and Redis unavailable.
    pub panic: Panic,
}

impl Default for Lease {
    fn default() -> Lease {
        Lease { batch: 50, low_water: 0.2, max_keys: 10_000, idle_ms: 5000, recheck_ms: 250, panic: Panic::default() }
    }
}

/// One key's reservoir; `F` is the lease in flight (the transport's).
#[derive(Debug)]
pub(crate) struct Entry<F> {
    pub tokens: u64,
    shared_remaining: u64,
    reset_ms: u64,
    reply_at: f64,
    pub flight: Option<F>,
    pub hold_until: f64,
    hold_retry: i64,
    hold_at: f64,
    used_at: f64,
    tick: u64,
}

impl<F> Entry<F> {
    fn new(now: f64) -> Entry<F> {
        Entry {
            tokens: 0,
            shared_remaining: 0,
            reset_ms: 0,
            reply_at: now,
            flight: None,
            hold_until: 0.0,
            hold_retry: 0,
            hold_at: 0.0,
            used_at: now,
            tick: 0,
        }
    }

    /// A lease of `asked` units answered `d` (`granted`: the units leased)
    /// at `now`: they join the reservoir, and a short lease holds the next
    /// one for `min(retry_after_ms, recheck_ms)`.
    pub fn leased(&mut self, d: &ratelimit_core::Decision, asked: u64, recheck_ms: u64, now: f64) {
        let (got, retry) = (d.granted, d.retry_after_ms);
        self.tokens = self.tokens.saturating_add(got);
        self.shared_remaining = d.remaining;
        self.reset_ms = d.reset_after_ms;
        self.reply_at = now;
        if got < asked {
            let wait = if retry >= 0 { (retry as f64).min(recheck_ms as f64) } else { recheck_ms as f64 };
            self.hold_until = now + wait;
            self.hold_retry = retry;
            self.hold_at = now;
        }
    }
}

/// The reservoirs of one leased limiter, by key, least recently used first.
pub(crate) struct Keys<F> {
    map: HashMap<String, Entry<F>>,
    lru: BTreeMap<u64, String>,
    tick: u64,
}

impl<F> Keys<F> {
    /// The entry of `key`, made most recently used; the evicted (key, units).
    pub fn touch(&mut self, key: &str, now: f64, max: usize) -> (&mut Entry<F>, Option<(String, u64)>) {
        self.tick += 1;
        let tick = self.tick;
        let mut evicted = None;
        if !self.map.contains_key(key) && self.map.len() >= max {
            // the least recently used key without a lease in flight
            let old = self.lru.iter().find(|(_, k)| self.map.get(*k).is_some_and(|e| e.flight.is_none()));
            if let Some((&t, k)) = old {
                let k = k.clone();
                self.lru.remove(&t);
                if let Some(e) = self.map.remove(&k) {
                    evicted = Some((k, e.tokens));
                }
            }
        }
        let e = self.map.entry(key.to_owned()).or_insert_with(|| Entry::new(now));
        self.lru.remove(&e.tick);
        e.tick = tick;
        e.used_at = now;
        self.lru.insert(tick, key.to_owned());
        (e, evicted)
    }

    /// Removes the keys unused for `idle_ms` with no lease in flight; their
    /// (key, units) to give back.
    pub fn idle(&mut self, now: f64, idle_ms: u64) -> Vec<(String, u64)> {
        let gone: Vec<String> = self
            .map
            .iter()
            .filter(|(_, e)| e.flight.is_none() && now - e.used_at >= idle_ms as f64)
            .map(|(key, _)| key.clone())
            .collect();
        gone.into_iter()
            .filter_map(|key| {
                let e = self.map.remove(&key)?;
                self.lru.remove(&e.tick);
                Some((key, e.tokens))
            })
            .collect()
    }

    /// Removes every key; their (key, units) to give back.
    pub fn drain(&mut self) -> Vec<(String, u64)> {
        self.lru.clear();
        self.map.drain().map(|(key, e)| (key, e.tokens)).collect()
    }
}

/// One leased limiter's policy, settings, panic limits and reservoirs, and
/// the decisions they answer.
pub(crate) struct Book<F> {
    pub policy: Policy,
    rule: Arc<Rule>,
    pub opts: Lease,
    panics: PanicBuckets,
    keys: Mutex<Keys<F>>,
    granted: AtomicU64,
}

impl<F> Book<F> {
    /// Refuses settings out of range.
    pub fn new(policy: Policy, opts: Lease) -> Result<Book<F>> {
        check_int("batch", opts.batch, 1)?;
        if !(opts.low_water >= 0.0 && opts.low_water <= 1.0) {
            return Err(Error::Invalid("low_water must be from 0 to 1".into()));
        }
        if opts.max_keys < 1 || opts.idle_ms < 1 || opts.recheck_ms < 1 {
            return Err(Error::Invalid("max_keys, idle_ms and recheck_ms must be >= 1".into()));
        }
        opts.panic.check()?;
        let rule = Arc::new(Rule::Single(policy.clone()));
        let panics = PanicBuckets::new(&opts.panic, rule.parts(), 100_000);
        let keys = Keys { map: HashMap::new(), lru: BTreeMap::new(), tick: 0 };
        Ok(Book { policy, rule, opts, panics, keys: Mutex::new(keys), granted: AtomicU64::new(0) })
    }

    pub fn lock(&self) -> MutexGuard<'_, Keys<F>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A decision from the reservoir: `granted` units, the shared figures
    /// as of the last lease's reply.
    fn reservoir(&self, e: &Entry<F>, granted: u64, retry_after_ms: i64, now: f64) -> Decision {
        let since = (now - e.reply_at).max(0.0) as u64;
        let d = ratelimit_core::Decision {
            granted,
            limit: self.policy.limit(),
            remaining: e.tokens.saturating_add(e.shared_remaining),
            retry_after_ms,
            reset_after_ms: e.reset_ms.saturating_sub(since),
        };
        Decision::of(&self.rule, d, retry_after_ms == 0, self.policy.name(), Source::Local, Vec::new())
    }

    /// A denial while the reservoir is dry and the shared policy said no.
    pub fn denial(&self, e: &Entry<F>, cost: u64, now: f64) -> Decision {
        let retry = if cost > self.policy.limit() {
            -1
        } else if e.hold_retry > 0 {
            ((e.hold_retry as f64 - (now - e.hold_at)).ceil() as i64).max(1)
        } else {
            ((e.hold_until - now).ceil() as i64).max(1)
        };
        self.reservoir(e, 0, retry, now)
    }

    /// A decision from the panic limits (Redis unavailable).
    pub fn panic(&self, key: &str, cost: u64, now: f64) -> Decision {
        answer::panic(&self.rule, &self.panics, &[key], Call::cost(cost), now)
    }

    /// Takes `cost` from the reservoir if it can; the decision, and whether
    /// a refill is due (below the low water, none in flight, no hold).
    pub fn take(&self, e: &mut Entry<F>, cost: u64, now: f64) -> Option<(Decision, bool)> {
        if e.tokens < cost {
            return None;
        }
        e.tokens -= cost;
        self.granted.fetch_add(cost, Relaxed);
        let d = self.reservoir(e, cost, 0, now);
        let low = (self.opts.low_water * self.opts.batch as f64) as u64;
        Some((d, e.tokens < low && e.flight.is_none() && now >= e.hold_until))
    }

    /// Puts `n` units back into `key`'s reservoir (capped at `batch`).
    pub fn put_back(&self, key: &str, n: u64) {
        let mut k = self.lock();
        if let Some(e) = k.map.get_mut(key) {
            let back = n.min(self.opts.batch.saturating_sub(e.tokens));
            e.tokens += back;
            self.granted.fetch_sub(back.min(self.granted.load(Relaxed)), Relaxed);
        }
    }

    /// Units held in the reservoirs (all keys).
    pub fn stranded(&self) -> u64 {
        self.lock().map.values().map(|e| e.tokens).sum()
    }

    /// Units granted from reservoirs so far (less those put back).
    pub fn granted(&self) -> u64 {
        self.granted.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::sliding_log;

    fn book(batch: u64, max_keys: usize) -> Book<()> {
        let opts = Lease { batch, max_keys, ..Lease::default() };
        Book::new(sliding_log("api", 100, 1000).unwrap(), opts).unwrap()
    }

    fn leased(granted: u64, remaining: u64, retry_after_ms: i64) -> ratelimit_core::Decision {
        ratelimit_core::Decision { granted, limit: 100, remaining, retry_after_ms, reset_after_ms: 1000 }
    }

    #[test]
    fn a_reservoir_grants_what_it_leased_and_asks_for_more_below_the_low_water() {
        let b = book(10, 10);
        let mut k = b.lock();
        let (e, _) = k.touch("k", 0.0, 10);
        assert!(b.take(e, 1, 0.0).is_none(), "an empty reservoir grants nothing");
        e.leased(&leased(10, 90, 0), 10, 250, 0.0);
        let (d, refill) = b.take(e, 7, 1.0).unwrap();
        assert!(d.allowed && d.granted == 7 && d.source == Source::Local && !refill);
        assert_eq!((d.remaining, d.reset_after_ms), (93, 999));
        let (_, refill) = b.take(e, 2, 1.0).unwrap();
        assert!(refill, "1 unit left of 10: below the low water (2)");
        assert!(b.take(e, 2, 1.0).is_none());
        drop(k);
        assert_eq!((b.granted(), b.stranded()), (9, 1));
        b.put_back("k", 100);
        assert_eq!((b.granted(), b.stranded()), (0, 10), "capped at one batch");
    }

    #[test]
    fn a_short_lease_holds_the_next_one_and_denies_meanwhile() {
        let b = book(10, 10);
        let mut k = b.lock();
        let (e, _) = k.touch("k", 0.0, 10);
        e.leased(&leased(3, 0, 400), 10, 250, 100.0);
        assert_eq!(e.hold_until, 350.0, "min(retry 400, recheck 250)");
        let (_, refill) = b.take(e, 3, 200.0).unwrap();
        assert!(!refill, "no refill while the hold lasts");
        let d = b.denial(e, 1, 200.0);
        assert!(!d.allowed && d.retry_after_ms == 300, "{d:?}");
        assert_eq!(b.denial(e, 101, 200.0).retry_after_ms, -1, "more than the limit: never");
    }

    #[test]
    fn keys_are_evicted_least_recently_used_and_swept_when_idle() {
        let b = book(10, 2);
        let mut k = b.lock();
        k.touch("a", 0.0, 2).0.tokens = 4;
        k.touch("b", 1.0, 2).0.tokens = 5;
        k.touch("a", 2.0, 2);
        let (_, evicted) = k.touch("c", 3.0, 2);
        assert_eq!(evicted, Some(("b".to_owned(), 5)));
        k.touch("a", 3.0, 2).0.flight = Some(());
        assert_eq!(k.idle(6000.0, 5000), vec![("c".to_owned(), 0)], "a lease in flight is not idle");
        assert_eq!(k.drain(), vec![("a".to_owned(), 4)]);
    }
}
