//! In-flight limits (clients/DESIGN.md, "In-flight limits: the guard"): a
//! [`Guard`] holds units of a concurrency policy (`RL.CONCURRENCY`, twin
//! `concurrency.lua`) from [`InFlight::acquire`] until it is dropped or
//! [`Guard::release`]d, renewing its lease in a task of its own meanwhile;
//! while Redis is unavailable a local in-flight limit decides.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::Value;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use crate::answer;
use crate::breaker::{Panic, Permit};
use crate::client::RateLimit;
use crate::decision::{Decision, Source};
use crate::error::{Error, Result};
use crate::policy::{check_int, Kind, Policy, Rule};
use crate::request::{hex, Hold, Request};
use crate::transport::Connection;

/// The settings of an [`InFlight`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InFlightOptions {
    /// How often a held guard sends `RENEW` (default `max(1, lease_ms / 3)`;
    /// from 1 to `lease_ms − 1`).
    pub renew_ms: Option<u64>,
    /// The local in-flight limit while Redis is unavailable: per key, at
    /// most [`Panic::capacity`] units held at once in this process (its
    /// window is not used).
    pub panic: Panic,
}

struct Shared<C> {
    rl: RateLimit<C>,
    policy: Policy,
    rule: Arc<Rule>,
    renew: Duration,
    local_cap: u64,
    /// Units held by the local in-flight limit, per key.
    local: Mutex<HashMap<String, u64>>,
}

/// An in-flight limit on one concurrency policy ([`RateLimit::inflight`]).
/// Cheap to clone (an `Arc`).
pub struct InFlight<C> {
    sh: Arc<Shared<C>>,
}

impl<C> Clone for InFlight<C> {
    fn clone(&self) -> Self {
        InFlight { sh: self.sh.clone() }
    }
}

impl<C: Connection> RateLimit<C> {
    /// An in-flight limit on a [`concurrency`](crate::concurrency) policy
    /// (any other kind is refused). Its guards need a tokio runtime (each
    /// held guard renews in a task).
    pub fn inflight(&self, policy: Policy, opts: InFlightOptions) -> Result<InFlight<C>> {
        if policy.kind() != Kind::Concurrency {
            return Err(Error::Invalid("inflight takes a concurrency policy (concurrency(name, limit, lease_ms))".into()));
        }
        let lease_ms = policy.window_ms();
        let renew_ms = match opts.renew_ms {
            None => (lease_ms / 3).max(1),
            Some(r) if r >= 1 && r < lease_ms.max(2) => r,
            Some(r) => return Err(Error::Invalid(format!("renew_ms must be an integer from 1 to lease_ms - 1, not {r}"))),
        };
        opts.panic.check()?;
        let sh = Shared {
            rl: self.clone(),
            local_cap: opts.panic.capacity(&policy),
            rule: Arc::new(Rule::Single(policy.clone())),
            policy,
            renew: Duration::from_millis(renew_ms),
            local: Mutex::new(HashMap::new()),
        };
        Ok(InFlight { sh: Arc::new(sh) })
    }
}

/// A fresh hold id: 128 random bits.
fn new_id() -> Result<[u8; 16]> {
    let mut id = [0u8; 16];
    getrandom::fill(&mut id).map_err(|e| Error::Unsupported(format!("no random source for a hold's id: {e}")))?;
    Ok(id)
}

/// The first integer of a reply (RENEW's and RELEASE's units).
fn first(v: &Value) -> Option<i64> {
    match v {
        Value::Array(a) => match a.first() {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        },
        _ => None,
    }
}

impl<C: Connection> Shared<C> {
    /// One RL.CONCURRENCY call through the breaker, bounded by the timeout.
    async fn call(&self, key: &str, action: Hold, id: [u8; 16], cost: u64) -> Result<(Value, Source)> {
        let i = &self.rl.inner;
        let req = Request::concurrency(&self.policy, key, action, id, cost);
        i.bounded(false, i.run(&req)).await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.local.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The local in-flight limit's decision (and whether it holds).
    fn local_acquire(&self, key: &str, cost: u64) -> (Decision, Held) {
        let cap = self.local_cap;
        let mut m = self.lock();
        let before = m.get(key).copied().unwrap_or(0);
        let ok = before.checked_add(cost).is_some_and(|t| t <= cap);
        let after = if ok { before + cost } else { before };
        if ok {
            m.insert(key.to_owned(), after);
        }
        drop(m);
        let retry = if ok {
            0
        } else if cost > cap {
            -1
        } else {
            1 // no lease to wait out: a release may come any time
        };
        let d = ratelimit_core::Decision {
            granted: if ok { cost } else { 0 },
            limit: cap,
            remaining: cap.saturating_sub(after),
            retry_after_ms: retry,
            reset_after_ms: 0,
        };
        let d = Decision::of(&self.rule, d, ok, self.policy.name(), Source::Panic, Vec::new());
        (d, if ok { Held::Local } else { Held::Nothing })
    }

    fn local_release(&self, key: &str, cost: u64) {
        let mut m = self.lock();
        if let Some(n) = m.get_mut(key) {
            *n = n.saturating_sub(cost);
            if *n == 0 {
                m.remove(key);
            }
        }
    }
}

/// Sends `RELEASE id` on a task of `rt` (from `Drop`: not awaited, not
/// retried); through the breaker when `gated`, else even while it is open
/// (one call, bounded by the timeout, counted in the breaker).
fn spawn_release<C: Connection>(rt: &Handle, sh: Arc<Shared<C>>, key: String, id: [u8; 16], gated: bool) {
    rt.spawn(async move {
        if gated {
            let _ = sh.call(&key, Hold::Release, id, 1).await;
        } else {
            let i = &sh.rl.inner;
            let req = Request::concurrency(&sh.policy, &key, Hold::Release, id, 1);
            let _ = i.bounded_inner(false, i.run(&req)).await;
        }
    });
}

/// An ACQUIRE on its way: dropped armed (the acquiring future was dropped
/// before its reply was read, or the ACQUIRE timed out), it sends a
/// RELEASE of its id, which frees the units if the server held them and
/// does nothing otherwise.
struct Pending<'a, C: Connection> {
    sh: &'a Arc<Shared<C>>,
    rt: &'a Handle,
    key: &'a str,
    id: [u8; 16],
    armed: bool,
}

impl<C: Connection> Drop for Pending<'_, C> {
    fn drop(&mut self) {
        if self.armed {
            spawn_release(self.rt, self.sh.clone(), self.key.to_owned(), self.id, false);
        }
    }
}

/// What a renewal task shares with its guard (weakly: the guard owns it).
#[derive(Debug, Default)]
struct Status {
    lost: AtomicBool,
    renewals: AtomicU64,
}

/// Where a guard's units are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Nothing (denied, or released).
    Nothing,
    /// On Redis: renewed, released with RELEASE.
    Server,
    /// By the local in-flight limit.
    Local,
}

impl<C: Connection> InFlight<C> {
    /// Holds `cost` units (≥ 1) of `key` under a fresh id: the guard's
    /// [`Guard::decision`] says whether they were granted. A granted guard
    /// holds them until it is dropped (or [`Guard::release`]d), renewing
    /// its lease meanwhile; a denied one holds nothing and sends nothing.
    /// Redis unavailable or the breaker open: the local in-flight limit
    /// decides (`Source::Panic`).
    pub async fn acquire(&self, key: &str, cost: u64) -> Result<Guard<C>> {
        check_int("cost", cost, 1)?;
        let id = new_id()?;
        let sh = &self.sh;
        let rt = Handle::current();
        let mut pending = Pending { sh, rt: &rt, key, id, armed: true };
        let i = &sh.rl.inner;
        let permit = i.breaker.acquire(i.now());
        let r = match permit {
            Permit::No => Err(Error::Unavailable("circuit breaker open".into())),
            p => {
                let req = Request::concurrency(&sh.policy, key, Hold::Acquire, id, cost);
                i.bounded_inner(p == Permit::Probe, i.run(&req)).await
            }
        };
        let (decision, held) = match r {
            Ok((v, source)) => {
                // an odd reply leaves `pending` armed: its RELEASE frees what it may hold
                let d = answer::single(&v, cost, false)?;
                let d = Decision::of(&sh.rule, d, d.granted == cost, sh.policy.name(), source, Vec::new());
                let held = if d.allowed { Held::Server } else { Held::Nothing };
                pending.armed = false;
                (d, held)
            }
            Err(Error::Unavailable(_)) => {
                // an ACQUIRE that timed out may still be applied (a stalled
                // server reads it later): a RELEASE of its id follows it on
                // the connection, whatever the breaker says
                pending.armed = permit != Permit::No;
                sh.local_acquire(key, cost)
            }
            Err(e) => {
                pending.armed = false; // refused by Redis: nothing held
                return Err(e);
            }
        };
        drop(pending);
        let decision = sh.rl.inner.m.count(decision);
        let status = Arc::new(Status::default());
        let renewer =
            (held == Held::Server).then(|| rt.spawn(renew(sh.clone(), key.to_owned(), id, Arc::downgrade(&status))));
        Ok(Guard { sh: sh.clone(), key: key.to_owned(), cost, id, hex: hex(&id), decision, held, status, renewer, rt })
    }

    /// The policy it limits.
    pub fn policy(&self) -> &Policy {
        &self.sh.policy
    }

    /// Units of `key` held by the local in-flight limit now (Redis
    /// unavailable when they were acquired).
    pub fn held_locally(&self, key: &str) -> u64 {
        self.sh.lock().get(key).copied().unwrap_or(0)
    }
}

/// Renews a held guard's lease every `renew` until its guard is gone (it
/// aborts this task), a RENEW answers 0 (lost) or the guard's status is
/// dropped. A RENEW that fails is tried again at the next tick.
async fn renew<C: Connection>(sh: Arc<Shared<C>>, key: String, id: [u8; 16], status: Weak<Status>) {
    loop {
        tokio::time::sleep(sh.renew).await;
        if status.strong_count() == 0 {
            return;
        }
        let r = sh.call(&key, Hold::Renew, id, 1).await;
        let Some(st) = status.upgrade() else { return };
        match r.map(|(v, _)| first(&v)) {
            Ok(Some(n)) if n > 0 => {
                st.renewals.fetch_add(1, Relaxed);
            }
            Ok(Some(0)) => {
                st.lost.store(true, Relaxed);
                return;
            }
            // unavailable (the breaker counted it), refused or odd: next tick
            _ => {}
        }
    }
}

/// Units held by [`InFlight::acquire`]. Dropping it releases them: the
/// renewal stops, then `RELEASE id` is sent once on a spawned task
/// ([`Guard::release`] does it in line); a local hold is given back at
/// once. Leaked (`mem::forget`), it is a guard never dropped: its renewal
/// task runs while its runtime does; once that stops, the lease lapses
/// within `lease_ms`.
pub struct Guard<C: Connection> {
    sh: Arc<Shared<C>>,
    key: String,
    cost: u64,
    id: [u8; 16],
    hex: [u8; 32],
    decision: Decision,
    held: Held,
    status: Arc<Status>,
    renewer: Option<JoinHandle<()>>,
    rt: Handle,
}

impl<C: Connection> Guard<C> {
    /// The units were granted (held now, until the guard ends).
    pub fn allowed(&self) -> bool {
        self.decision.allowed
    }

    /// The acquire's decision: `granted` = cost or 0, `remaining` = free
    /// units, `source` `Module`, `Lua` or `Panic` (the local limit).
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The id the lease is held under: 32 lowercase hex digits.
    pub fn id(&self) -> &str {
        // hex digits are ASCII
        std::str::from_utf8(&self.hex).unwrap_or_default()
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// A RENEW found the lease lapsed (Redis away longer than the lease, or
    /// the key deleted): the work goes on but is no longer counted.
    pub fn lost(&self) -> bool {
        self.status.lost.load(Relaxed)
    }

    /// RENEWs the server answered 1.
    pub fn renewals(&self) -> u64 {
        self.status.renewals.load(Relaxed)
    }

    fn stop_renewing(&mut self) {
        if let Some(t) = self.renewer.take() {
            t.abort();
        }
    }

    /// Releases now, in line: the renewal stops, then `RELEASE id` (a
    /// local hold is given back; a denied guard sends nothing).
    /// `Error::Unavailable` when the RELEASE could not reach Redis (not
    /// retried: the lease lapses within `lease_ms`).
    pub async fn release(mut self) -> Result<()> {
        self.stop_renewing();
        match self.held {
            Held::Server => {
                let r = self.sh.call(&self.key, Hold::Release, self.id, 1).await;
                // dropped before this point, `Drop` sends it again (idempotent)
                self.held = Held::Nothing;
                r.map(|_| ())
            }
            Held::Local => {
                self.sh.local_release(&self.key, self.cost);
                self.held = Held::Nothing;
                Ok(())
            }
            Held::Nothing => Ok(()),
        }
    }
}

impl<C: Connection> Drop for Guard<C> {
    fn drop(&mut self) {
        self.stop_renewing();
        match std::mem::replace(&mut self.held, Held::Nothing) {
            Held::Server => spawn_release(&self.rt, self.sh.clone(), std::mem::take(&mut self.key), self.id, true),
            Held::Local => self.sh.local_release(&self.key, self.cost),
            Held::Nothing => {}
        }
    }
}

impl<C: Connection> std::fmt::Debug for Guard<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("key", &self.key)
            .field("id", &self.id())
            .field("cost", &self.cost)
            .field("held", &self.held)
            .field("lost", &self.lost())
            .field("renewals", &self.renewals())
            .field("decision", &self.decision)
            .finish()
    }
}
