//! Leased limiters: a local reservoir per key, filled with `COST batch
//! PARTIAL` leases on the shared policy (pre-debited, so all instances
//! together never exceed it), refilled in the background, given back with
//! `REFUND` when a key goes idle, is evicted (LRU) or the limiter closes.
//! This is their I/O: the reservoirs and their decisions are
//! `reservoir.rs`'s.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;

use crate::answer;
use crate::breaker::Permit;
use crate::client::RateLimit;
use crate::decision::{Decision, Source};
use crate::error::{Error, Result};
use crate::policy::{check_int, not_concurrency, Policy};
use crate::request::{Request, Tail};
use crate::reservoir::{Book, Lease};
use crate::transport::{Connection, Inner};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Replied,
    NoReply,
}

type Flight = watch::Receiver<Option<Outcome>>;
type Entry = crate::reservoir::Entry<Flight>;

/// What a caller the reservoir could not answer does next.
enum Next {
    Wait(Flight),
    Panic,
    Lease(watch::Sender<Option<Outcome>>),
}

struct Shared<C> {
    rl: RateLimit<C>,
    book: Book<Flight>,
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
        not_concurrency(&policy, "a leased limiter")?;
        let sh = Arc::new(Shared { rl: self.clone(), book: Book::new(policy, opts)? });
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
        Duration::from_millis((sh.book.opts.idle_ms / 2).max(10))
    };
    loop {
        tokio::time::sleep(every).await;
        let Some(sh) = weak.upgrade() else { return };
        let now = inner(&sh).now();
        let idle = sh.book.lock().idle(now, sh.book.opts.idle_ms);
        for (key, n) in idle {
            let _ = sh.refund_units(&key, n).await;
        }
    }
}

impl<C: Connection> Shared<C> {
    /// Gives `n` reservoir units of `key` back to the shared policy.
    async fn refund_units(&self, key: &str, n: u64) -> Result<u64> {
        if n == 0 {
            return Ok(0);
        }
        let i = inner(self);
        let req = Request::single(&self.book.policy, key, Tail::Refund(n));
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
        let req = Request::single(
            &self.book.policy,
            &key,
            Tail::Call { cost: asked, partial: true, dry_run: false, force: false },
        );
        i.m.leases.fetch_add(1, Relaxed);
        let r = i.bounded_inner(probe, i.run(&req)).await;
        let now = i.now();
        let parsed = r.and_then(|(v, source)| Ok((answer::single(&v, asked, true)?, source)));
        let mut k = self.book.lock();
        let (e, evicted) = k.touch(&key, now, usize::MAX);
        debug_assert!(evicted.is_none());
        e.flight = None;
        let out = match parsed {
            Ok((d, source)) => {
                e.leased(&d, asked, self.book.opts.recheck_ms, now);
                i.m.lease_tokens.fetch_add(d.granted, Relaxed);
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
        let asked = self.book.opts.batch;
        tokio::spawn(async move {
            let _ = me.lease(key, asked, probe, tx).await;
        });
    }

    fn panic(&self, key: &str, cost: u64) -> Decision {
        self.book.panic(key, cost, inner(self).now())
    }

    /// Takes `cost` from the reservoir if it can; starts a refill when it
    /// runs low (single flight, never while a shared denial holds).
    fn take(self: &Arc<Self>, e: &mut Entry, key: &str, cost: u64, now: f64) -> Option<Decision> {
        let (d, refill) = self.book.take(e, cost, now)?;
        if refill {
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
        let mut k = self.book.lock();
        let (e, _) = k.touch(key, now, usize::MAX);
        match self.take(e, key, cost, now) {
            Some(mut d) => {
                if source != Source::Local {
                    d.source = source;
                }
                d
            }
            None => self.book.denial(e, cost, now),
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
            let mut k = sh.book.lock();
            let (e, evicted) = k.touch(key, now, sh.book.opts.max_keys);
            if let Some(d) = sh.take(e, key, cost, now) {
                drop(k);
                self.give_back(evicted);
                return Ok(i.m.count(d));
            }
            if let Some(rx) = e.flight.clone() {
                (Next::Wait(rx), evicted)
            } else if now < e.hold_until {
                let d = sh.book.denial(e, cost, now);
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
                let asked = sh.book.opts.batch.max(cost);
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
        self.sh.book.put_back(key, n)
    }

    /// The policy it limits.
    pub fn policy(&self) -> &Policy {
        &self.sh.book.policy
    }

    /// Units held in this limiter's reservoirs (all keys).
    pub fn stranded(&self) -> u64 {
        self.sh.book.stranded()
    }

    /// Units granted from reservoirs so far (less those refunded locally).
    pub fn granted(&self) -> u64 {
        self.sh.book.granted()
    }

    /// Gives every reservoir back with `REFUND` (one call per key) and stops
    /// the idle sweeper; the units given back.
    pub async fn close(&self) -> Result<u64> {
        self.sweeper.abort();
        let all = self.sh.book.lock().drain();
        let mut back = 0;
        for (key, n) in all {
            back += self.sh.refund_units(&key, n).await?;
        }
        Ok(back)
    }
}
