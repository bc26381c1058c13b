//! `RateLimit`: one connection, one backend and one breaker (the
//! [`transport`](crate::transport)); the limiters made from it share all
//! three. A [`Limiter`] decides each call on Redis: it encodes the request
//! (`request`), sends it through the transport, and reads the reply or,
//! when Redis is unavailable, asks the panic limits (`answer`).

use std::borrow::Cow;
use std::sync::Arc;

use crate::answer;
use crate::breaker::{Panic, PanicBuckets, Permit};
use crate::decision::{Decision, Source};
use crate::error::{Error, Result};
use crate::keys::assert_same_slot;
use crate::metrics::Metrics;
use crate::options::Options;
use crate::policy::{check_int, not_concurrency, Rule};
use crate::request::{Call, Request, Tail};
use crate::transport::{Connection, Fail, Inner};

/// One Redis connection, one backend and one breaker, shared by the
/// limiters made from it. Cheap to clone (an `Arc`).
pub struct RateLimit<C> {
    pub(crate) inner: Arc<Inner<C>>,
}

impl<C> Clone for RateLimit<C> {
    fn clone(&self) -> Self {
        RateLimit { inner: self.inner.clone() }
    }
}

impl<C: Connection> RateLimit<C> {
    /// A `RateLimit` over a connection (a redis-rs `ConnectionManager` or
    /// `MultiplexedConnection`). Refuses settings out of range.
    pub fn new(conn: C, opts: Options) -> Result<RateLimit<C>> {
        Ok(RateLimit { inner: Arc::new(Inner::new(conn, opts)?) })
    }

    /// The chosen backend once known (after [`detect`](Self::detect) or a
    /// first call): `Source::Module` or `Source::Lua`.
    pub fn backend(&self) -> Option<Source> {
        self.inner.source()
    }

    /// Finds out which backend the server offers (one call, bounded by the
    /// timeout, through the breaker).
    pub async fn detect(&self) -> Result<Source> {
        let inner = self.inner.clone();
        self.inner
            .bounded(false, async move {
                inner.ensure_detected().await?;
                inner.source().ok_or_else(|| Fail::Ours(Error::Protocol("no backend".into())))
            })
            .await
    }

    /// A limiter deciding every call on Redis (one bounded call per
    /// decision), with the panic limits `panic` while Redis is unavailable.
    pub fn limiter(&self, rule: impl Into<Rule>, panic: Panic) -> Result<Limiter<C>> {
        panic.check()?;
        let rule = Arc::new(rule.into());
        for p in rule.parts() {
            not_concurrency(p, "a limiter")?;
        }
        let panics = PanicBuckets::new(&panic, rule.parts(), 100_000);
        Ok(Limiter { rl: self.clone(), rule, panics: Arc::new(panics) })
    }

    /// The counters and the breaker's state.
    pub fn metrics(&self) -> Metrics {
        self.inner.m.snapshot(self.inner.breaker.counts(), self.inner.breaker.state())
    }
}

/// Decides every call on Redis (one bounded call per decision); panic
/// limits while it is unavailable or the breaker is open.
pub struct Limiter<C> {
    rl: RateLimit<C>,
    rule: Arc<Rule>,
    panics: Arc<PanicBuckets>,
}

impl<C> Clone for Limiter<C> {
    fn clone(&self) -> Self {
        Limiter { rl: self.rl.clone(), rule: self.rule.clone(), panics: self.panics.clone() }
    }
}

impl<C: Connection> Limiter<C> {
    /// The rule it limits.
    pub fn rule(&self) -> &Rule {
        &self.rule
    }

    /// The keys of one call: a single policy's key as given; for `all_of`
    /// `"{key}:{part name}"` per part. Cross-slot keys are refused here,
    /// before any call.
    fn keys_for<'k>(&self, key: &'k str) -> Result<Vec<Cow<'k, str>>> {
        match &*self.rule {
            Rule::Single(_) => Ok(vec![Cow::Borrowed(key)]),
            Rule::AllOf(a) => {
                let keys: Vec<Cow<'k, str>> = a.parts().iter().map(|p| Cow::Owned(format!("{key}:{}", p.name()))).collect();
                assert_same_slot(&keys)?;
                Ok(keys)
            }
        }
    }

    fn keys_each<'k>(&self, keys: &[&'k str]) -> Result<Vec<Cow<'k, str>>> {
        let keys = self.keys_each_any_slot(keys)?;
        assert_same_slot(&keys)?;
        Ok(keys)
    }

    /// [`Self::keys_each`] without the slot check (a server that is not a cluster).
    fn keys_each_any_slot<'k>(&self, keys: &[&'k str]) -> Result<Vec<Cow<'k, str>>> {
        let n = self.rule.parts().len();
        if !matches!(&*self.rule, Rule::AllOf(_)) || keys.len() != n {
            return Err(Error::Invalid(format!("{:?} needs {n} keys, got {}", self.rule.name(), keys.len())));
        }
        for (i, k) in keys.iter().enumerate() {
            if keys[..i].contains(k) {
                return Err(Error::Invalid("the keys of an all_of call must be distinct".into()));
            }
        }
        Ok(keys.iter().map(|&k| Cow::Borrowed(k)).collect())
    }

    /// One decision for `key` (for `all_of`: `key:part` per part).
    pub async fn limit(&self, key: &str, call: Call) -> Result<Decision> {
        let keys = self.keys_for(key)?;
        self.decide(keys, call).await
    }

    /// One `all_of` decision with one key per part (same slot, distinct).
    pub async fn limit_keys(&self, keys: &[&str], call: Call) -> Result<Decision> {
        let keys = self.keys_each(keys)?;
        self.decide(keys, call).await
    }

    /// [`Self::limit_keys`] on a connection that is not a cluster: the keys
    /// need not share a slot (one server holds them all).
    pub async fn limit_keys_any_slot(&self, keys: &[&str], call: Call) -> Result<Decision> {
        let keys = self.keys_each_any_slot(keys)?;
        self.decide(keys, call).await
    }

    /// [`Self::refund`] of an `all_of` call on one key per part (as
    /// [`Self::limit_keys`] took them): `n × WEIGHT` back to each part.
    pub async fn refund_keys(&self, keys: &[&str], n: u64) -> Result<Decision> {
        check_int("refund", n, 1)?;
        let keys = self.keys_each(keys)?;
        self.refund_of(keys, n).await
    }

    fn request<'k>(&self, keys: Vec<Cow<'k, str>>, tail: Tail) -> Request<'k> {
        match &*self.rule {
            Rule::Single(p) => Request::single_of(p, keys, tail),
            Rule::AllOf(a) => Request::multi(a.parts(), keys, tail),
        }
    }

    fn panic(&self, keys: &[Cow<'_, str>], call: Call) -> Decision {
        answer::panic(&self.rule, &self.panics, keys, call, self.rl.inner.now())
    }

    async fn decide(&self, keys: Vec<Cow<'_, str>>, call: Call) -> Result<Decision> {
        check_int("cost", call.cost, 0)?;
        let inner = &self.rl.inner;
        if call.force && call.partial {
            return Err(Error::Invalid("a debit (force) takes all its units: not with partial".into()));
        }
        let tail = Tail::Call { cost: call.cost, partial: call.partial, dry_run: call.dry_run, force: call.force };
        match inner.breaker.acquire(inner.now()) {
            Permit::Yes => {}
            Permit::No => return Ok(inner.m.count(self.panic(&keys, call))),
            Permit::Probe => {
                // the probe goes out in the background (the same call as a
                // DRYRUN: it takes nothing); this caller is answered now
                let probe_req = self
                    .request(
                        keys.clone(),
                        Tail::Call { cost: call.cost, partial: call.partial, dry_run: true, force: call.force },
                    )
                    .into_owned();
                let bg = inner.clone();
                tokio::spawn(async move {
                    let i2 = bg.clone();
                    let _ = bg.bounded(true, async move { i2.run(&probe_req).await }).await;
                });
                return Ok(inner.m.count(self.panic(&keys, call)));
            }
        }
        // the panic limits, if Redis does not answer, take the request's own keys
        let req = self.request(keys, tail);
        let r = inner.bounded_inner(false, inner.run(&req)).await;
        match r {
            Ok((v, source)) => Ok(inner.m.count(answer::decode(&self.rule, &v, call.cost, call.partial, source)?)),
            Err(Error::Unavailable(_)) => Ok(inner.m.count(self.panic(&req.keys, call))),
            Err(e) => Err(e),
        }
    }

    /// Gives `n` units back to `key` (REFUND); `granted` = units given back.
    /// `Error::Unavailable` when Redis is (no panic limits for refunds).
    pub async fn refund(&self, key: &str, n: u64) -> Result<Decision> {
        check_int("refund", n, 1)?;
        let keys = self.keys_for(key)?;
        self.refund_of(keys, n).await
    }

    async fn refund_of(&self, keys: Vec<Cow<'_, str>>, n: u64) -> Result<Decision> {
        let inner = &self.rl.inner;
        let req = self.request(keys, Tail::Refund(n));
        let (v, source) = inner.bounded(false, inner.run(&req)).await?;
        let mut d = answer::decode(&self.rule, &v, n, true, source)?;
        d.allowed = true;
        inner.m.refunded(d.granted);
        Ok(d)
    }
}
