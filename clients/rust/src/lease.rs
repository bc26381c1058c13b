//! Leased limiters: a local reservoir per key, filled with `COST batch
//! PARTIAL` leases on the shared policy (pre-debited, so all instances
//! together never exceed it), refilled in the background, given back with
//! `REFUND` when a key goes idle, is evicted (LRU) or the limiter closes.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;

use crate::answer;
use crate::breaker::{Panic, PanicBuckets, Permit};
use crate::client::RateLimit;
use crate::decision::{Decision, Source};
use crate::error::{Error, Result};
use crate::policy::{check_int, Policy, Rule};
use crate::request::{Call, Request, Tail};
use crate::transport::{Connection, Inner};

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Replied,
    NoReply,
}

type Flight = watch::Receiver<Option<Outcome>>;

/// What a caller the reservoir could not answer does next.
enum Next {
    Wait(Flight),
    Panic,
    Lease(watch::Sender<Option<Outcome>>),
}

#[derive(Debug)]
struct Entry {
    tokens: u64,
    shared_remaining: u64,
    reset_ms: u64,
    reply_at: f64,
    flight: Option<Flight>,
    hold_until: f64,
    hold_retry: i64,
    hold_at: f64,
    used_at: f64,
    tick: u64,
}

impl Entry {
    fn new(now: f64) -> Entry {
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
}

#[derive(Default)]
struct Keys {
    map: HashMap<String, Entry>,
    lru: BTreeMap<u64, String>,
    tick: u64,
}

impl Keys {
    /// The entry of `key`, made most recently used; the evicted (key, units).
    fn touch(&mut self, key: &str, now: f64, max: usize) -> (&mut Entry, Option<(String, u64)>) {
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
}

struct Shared<C> {
    rl: RateLimit<C>,
    policy: Policy,
    rule: Arc<Rule>,
    opts: Lease,
    panics: PanicBuckets,
    keys: Mutex<Keys>,
    granted: AtomicU64,
}

/// A two-tier limiter over one single policy: decisions from a local
/// reservoir per key (`Source::Local`, no I/O) while it lasts.
pub struct LeasedLimiter<C> {
    sh: Arc<Shared<C>>,
    sweeper: tokio::task::JoinHandle<()>,
}

impl<C> Drop for LeasedLimiter<C> {
    fn drop(&mut self) {
        self.sweeper.abort();
    }
}

impl<C: Connection> RateLimit<C> {
    /// A leased limiter for a single policy (`all_of` leases are not
    /// supported). Needs a tokio runtime (its idle sweeper is a task).
    pub fn leased(&self, policy: Policy, opts: Lease) -> Result<LeasedLimiter<C>> {
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
        let sh = Arc::new(Shared {
            rl: self.clone(),
            policy,
            rule,
            opts,
            panics,
            keys: Mutex::new(Keys::default()),
            granted: AtomicU64::new(0),
        });
        let sweeper = tokio::spawn(sweep(Arc::downgrade(&sh)));
        Ok(LeasedLimiter { sh, sweeper })
    }
}

fn inner<C>(sh: &Shared<C>) -> &Inner<C> {
    &sh.rl.inner
}

async fn sweep<C: Connection>(weak: Weak<Shared<C>>) {
    let every = {
        let Some(sh) = weak.upgrade() else { return };
        Duration::from_millis((sh.opts.idle_ms / 2).max(10))
    };
    loop {
        tokio::time::sleep(every).await;
        let Some(sh) = weak.upgrade() else { return };
        let now = inner(&sh).now();
        let idle: Vec<(String, u64)> = {
            let mut k = sh.lock();
            let gone: Vec<String> = k
                .map
                .iter()
                .filter(|(_, e)| e.flight.is_none() && now - e.used_at >= sh.opts.idle_ms as f64)
                .map(|(key, _)| key.clone())
                .collect();
            gone.into_iter()
                .filter_map(|key| {
                    let e = k.map.remove(&key)?;
                    k.lru.remove(&e.tick);
                    Some((key, e.tokens))
                })
                .collect()
        };
        for (key, n) in idle {
            let _ = sh.refund_units(&key, n).await;
        }
    }
}

impl<C: Connection> Shared<C> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Keys> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives `n` reservoir units of `key` back to the shared policy.
    async fn refund_units(&self, key: &str, n: u64) -> Result<u64> {
        if n == 0 {
            return Ok(0);
        }
        let i = inner(self);
        let req = Request::single(&self.policy, key, Tail::Refund(n));
        let (v, _) = i.bounded(false, i.run(&req)).await?;
        let back = answer::single(&v, n, true)?.granted;
        i.m.refunded(back);
        Ok(back)
    }

    /// One lease of `asked` units for `key`; its outcome goes to `tx`.
    async fn lease(
        self: &Arc<Self>,
        key: String,
        asked: u64,
        probe: bool,
        tx: watch::Sender<Option<Outcome>>,
    ) -> Result<(Outcome, Source)> {
        let i = inner(self);
        let req = Request::single(&self.policy, &key, Tail::Call { cost: asked, partial: true, dry_run: false });
        i.m.leases.fetch_add(1, Relaxed);
        let r = i.bounded_inner(probe, i.run(&req)).await;
        let now = i.now();
        let parsed = r.and_then(|(v, source)| Ok((answer::single(&v, asked, true)?, source)));
        let mut k = self.lock();
        let (e, evicted) = k.touch(&key, now, usize::MAX);
        debug_assert!(evicted.is_none());
        e.flight = None;
        let out = match parsed {
            Ok((d, source)) => {
                let (got, retry) = (d.granted, d.retry_after_ms);
                e.tokens = e.tokens.saturating_add(got);
                e.shared_remaining = d.remaining;
                e.reset_ms = d.reset_after_ms;
                e.reply_at = now;
                if got < asked {
                    let wait = if retry >= 0 {
                        (retry as f64).min(self.opts.recheck_ms as f64)
                    } else {
                        self.opts.recheck_ms as f64
                    };
                    e.hold_until = now + wait;
                    e.hold_retry = retry;
                    e.hold_at = now;
                }
                i.m.lease_tokens.fetch_add(got, Relaxed);
                Ok((Outcome::Replied, source))
            }
            Err(Error::Unavailable(_)) => Ok((Outcome::NoReply, Source::Panic)),
            Err(err) => Err(err),
        };
        drop(k);
        let _ = tx.send(Some(match out {
            Ok((o, _)) => o,
            Err(_) => Outcome::NoReply,
        }));
        out
    }

    /// Starts a lease for `key` in the background (the entry's flight).
    fn spawn_lease(self: &Arc<Self>, e: &mut Entry, key: &str, probe: bool) {
        let (tx, rx) = watch::channel(None);
        e.flight = Some(rx);
        let me = self.clone();
        let key = key.to_owned();
        let asked = self.opts.batch;
        tokio::spawn(async move {
            let _ = me.lease(key, asked, probe, tx).await;
        });
    }

    /// A decision from the reservoir: `granted` of `cost`, the shared
    /// figures as of the last lease's reply.
    fn reservoir(&self, e: &Entry, granted: u64, retry_after_ms: i64, now: f64) -> Decision {
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

    fn local(&self, e: &Entry, cost: u64, now: f64) -> Decision {
        self.granted.fetch_add(cost, Relaxed);
        self.reservoir(e, cost, 0, now)
    }

    fn denial(&self, e: &Entry, cost: u64, now: f64) -> Decision {
        let retry = if cost > self.policy.limit() {
            -1
        } else if e.hold_retry > 0 {
            ((e.hold_retry as f64 - (now - e.hold_at)).ceil() as i64).max(1)
        } else {
            ((e.hold_until - now).ceil() as i64).max(1)
        };
        self.reservoir(e, 0, retry, now)
    }

    fn panic(&self, key: &str, cost: u64) -> Decision {
        answer::panic(&self.rule, &self.panics, &[key], Call::cost(cost), inner(self).now())
    }

    /// Takes `cost` from the reservoir if it can; starts a refill when it
    /// runs low (single flight, never while a shared denial holds).
    fn take(self: &Arc<Self>, e: &mut Entry, key: &str, cost: u64, now: f64) -> Option<Decision> {
        if e.tokens < cost {
            return None;
        }
        e.tokens -= cost;
        let d = self.local(e, cost, now);
        let low = (self.opts.low_water * self.opts.batch as f64) as u64;
        if e.tokens < low && e.flight.is_none() && now >= e.hold_until {
            match inner(self).breaker.acquire(now) {
                Permit::No => {}
                p => self.spawn_lease(e, key, p == Permit::Probe),
            }
        }
        Some(d)
    }

    /// After a lease this caller waited for or sent: the reservoir decides.
    fn after(self: &Arc<Self>, key: &str, cost: u64, outcome: Outcome, source: Source) -> Decision {
        if outcome == Outcome::NoReply {
            return self.panic(key, cost);
        }
        let now = inner(self).now();
        let mut k = self.lock();
        let (e, _) = k.touch(key, now, usize::MAX);
        match self.take(e, key, cost, now) {
            Some(mut d) => {
                if source != Source::Local {
                    d.source = source;
                }
                d
            }
            None => self.denial(e, cost, now),
        }
    }
}

impl<C: Connection> LeasedLimiter<C> {
    /// One decision for `key`: from the reservoir when it can (no I/O),
    /// else one lease on the caller's path (bounded by the timeout).
    pub async fn limit(&self, key: &str, cost: u64) -> Result<Decision> {
        check_int("cost", cost, 0)?;
        let sh = &self.sh;
        let i = inner(sh);
        let now = i.now();
        let (next, evicted) = {
            let mut k = sh.lock();
            let (e, evicted) = k.touch(key, now, sh.opts.max_keys);
            if let Some(d) = sh.take(e, key, cost, now) {
                drop(k);
                self.give_back(evicted);
                return Ok(i.m.count(d));
            }
            if let Some(rx) = e.flight.clone() {
                (Next::Wait(rx), evicted)
            } else if now < e.hold_until {
                let d = sh.denial(e, cost, now);
                drop(k);
                self.give_back(evicted);
                return Ok(i.m.count(d));
            } else {
                match i.breaker.acquire(now) {
                    Permit::No => (Next::Panic, evicted),
                    Permit::Probe => {
                        // the probe is a lease the background sends; this
                        // caller is answered now
                        sh.spawn_lease(e, key, true);
                        (Next::Panic, evicted)
                    }
                    Permit::Yes => {
                        let (tx, rx) = watch::channel(None);
                        e.flight = Some(rx);
                        (Next::Lease(tx), evicted)
                    }
                }
            }
        };
        self.give_back(evicted);
        let mut rx = match next {
            Next::Wait(rx) => rx,
            Next::Panic => return Ok(i.m.count(sh.panic(key, cost))),
            Next::Lease(tx) => {
                let asked = sh.opts.batch.max(cost);
                let (o, source) = sh.lease(key.to_owned(), asked, false, tx).await?;
                return Ok(i.m.count(sh.after(key, cost, o, source)));
            }
        };
        // a lease is in flight: wait for it (at most the timeout) unless the
        // breaker refuses, then take no lease of our own
        if i.breaker.refuses(now) {
            return Ok(i.m.count(sh.panic(key, cost)));
        }
        i.m.lease_waits.fetch_add(1, Relaxed);
        let got = tokio::time::timeout(i.timeout, rx.wait_for(|o| o.is_some())).await;
        let o = match got {
            Ok(Ok(v)) => v.unwrap_or(Outcome::NoReply),
            _ => Outcome::NoReply,
        };
        Ok(i.m.count(sh.after(key, cost, o, Source::Local)))
    }

    fn give_back(&self, evicted: Option<(String, u64)>) {
        if let Some((key, n)) = evicted.filter(|(_, n)| *n > 0) {
            let sh = self.sh.clone();
            tokio::spawn(async move {
                let _ = sh.refund_units(&key, n).await;
            });
        }
    }

    /// Puts `n` units back into `key`'s reservoir (capped at `batch`); no I/O.
    pub fn refund(&self, key: &str, n: u64) {
        let mut k = self.sh.lock();
        if let Some(e) = k.map.get_mut(key) {
            let back = n.min(self.sh.opts.batch.saturating_sub(e.tokens));
            e.tokens += back;
            self.sh.granted.fetch_sub(back.min(self.sh.granted.load(Relaxed)), Relaxed);
        }
    }

    /// The policy it limits.
    pub fn policy(&self) -> &Policy {
        &self.sh.policy
    }

    /// Units held in this limiter's reservoirs (all keys).
    pub fn stranded(&self) -> u64 {
        self.sh.lock().map.values().map(|e| e.tokens).sum()
    }

    /// Units granted from reservoirs so far (less those refunded locally).
    pub fn granted(&self) -> u64 {
        self.sh.granted.load(Relaxed)
    }

    /// Gives every reservoir back with `REFUND` (one call per key) and stops
    /// the idle sweeper; the units given back.
    pub async fn close(&self) -> Result<u64> {
        self.sweeper.abort();
        let all: Vec<(String, u64)> = {
            let mut k = self.sh.lock();
            k.lru.clear();
            k.map.drain().map(|(key, e)| (key, e.tokens)).collect()
        };
        let mut back = 0;
        for (key, n) in all {
            back += self.sh.refund_units(&key, n).await?;
        }
        Ok(back)
    }
}
