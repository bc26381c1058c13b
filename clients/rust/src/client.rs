//! `RateLimit`: one connection, one backend, one breaker; the limiters made
//! from it share all three. Every Redis call of a decision is bounded by
//! the library's own timeout (`tokio::time::timeout` around the driver's
//! future), whatever the driver does meanwhile (reconnects, retries).

use std::borrow::Cow;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};

use crate::backend::{detect_reply, Backend, Found, Request, Tail, DETECT};
use crate::breaker::{Breaker, BreakerState, Panic, PanicBuckets, Permit, State};
use crate::decision::{Decision, Part, Source};
use crate::error::{Error, Result};
use crate::keys::assert_same_slot;
use crate::policy::{check_int, Rule};

/// A connection the library can send through: any async redis-rs
/// connection (`ConnectionManager`, `MultiplexedConnection`), cloned per call.
pub trait Connection: ConnectionLike + Clone + Send + Sync + 'static {}
impl<T: ConnectionLike + Clone + Send + Sync + 'static> Connection for T {}

/// The settings of a [`RateLimit`].
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The bound of every call, in ms (default 5). A decision never waits
    /// longer than this plus scheduling slack.
    pub timeout_ms: u64,
    /// Which backend (default: detected).
    pub backend: Backend,
    /// The breaker's settings.
    pub breaker: Breaker,
    /// Strict mode: `WAIT` after each call that can grant (default off).
    pub strict: Option<Strict>,
}

impl Default for Options {
    fn default() -> Options {
        Options { timeout_ms: 5, backend: Backend::Auto, breaker: Breaker::default(), strict: None }
    }
}

/// Strict mode (clients/DESIGN.md, "Strict mode"): each call that can
/// grant (not a refund, not a dry run) goes in one pipeline with
/// `WAIT replicas ms`, and units it granted count only when at least
/// `replicas` replicas acknowledged them; otherwise the call is a failure
/// (`unreplicated`): the breaker counts it and the panic limits decide. A
/// denial needs no acknowledgement. Not on a cluster (refused before the
/// first call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strict {
    /// Replicas that must acknowledge a grant (at least 1; set it to every
    /// replica Sentinel may promote).
    pub replicas: u64,
    /// WAIT's timeout in ms (default ⌊0.8 × `timeout_ms`⌋): at least 1 and
    /// below `timeout_ms`.
    pub wait_ms: Option<u64>,
}

impl Default for Strict {
    fn default() -> Strict {
        Strict { replicas: 1, wait_ms: None }
    }
}

/// The counters of a [`RateLimit`] and its breaker's state (the names of
/// clients/DESIGN.md's metrics table).
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

#[derive(Debug, Clone, Copy, Default)]
struct Chosen {
    source: Option<Source>, // Module or Lua once known
    /// The module's commands, once asked (`None`: not asked yet).
    found: Option<Found>,
    /// Strict mode: whether the server is a cluster node, once asked.
    cluster: Option<bool>,
}

pub(crate) struct Inner<C> {
    conn: C,
    pub(crate) timeout: Duration,
    /// Strict mode: (replicas, WAIT's ms).
    strict: Option<(u64, u64)>,
    wanted: Backend,
    chosen: Mutex<Chosen>,
    pub(crate) breaker: BreakerState,
    pub(crate) m: Counters,
    epoch: Instant,
}

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

/// What went wrong inside one bounded call.
pub(crate) enum Fail {
    Redis(RedisError),
    Ours(Error),
    /// Strict mode: a grant fewer replicas acknowledged than asked.
    Unreplicated(String),
}

impl From<RedisError> for Fail {
    fn from(e: RedisError) -> Fail {
        Fail::Redis(e)
    }
}

/// Error replies that mean the server cannot serve right now: failures.
const UNAVAILABLE: [&str; 7] = ["BUSY", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS", "READONLY"];

fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) || e.code() == Some("NOSCRIPT")
}

pub(crate) fn int(v: &Value) -> Result<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(Error::Protocol(format!("{other:?}"))),
    }
}

pub(crate) fn uint(v: &Value) -> Result<u64> {
    u64::try_from(int(v)?).map_err(|_| Error::Protocol(format!("{v:?}")))
}

impl<C: Connection> RateLimit<C> {
    /// A `RateLimit` over a connection (a redis-rs `ConnectionManager` or
    /// `MultiplexedConnection`). Refuses settings out of range.
    pub fn new(conn: C, opts: Options) -> Result<RateLimit<C>> {
        if opts.timeout_ms == 0 {
            return Err(Error::Invalid("timeout_ms must be >= 1".into()));
        }
        opts.breaker.check()?;
        let strict = match opts.strict {
            None => None,
            Some(st) => {
                if st.replicas == 0 {
                    return Err(Error::Invalid("strict: replicas must be >= 1".into()));
                }
                let wait = st.wait_ms.unwrap_or(opts.timeout_ms * 4 / 5);
                if wait == 0 || wait >= opts.timeout_ms {
                    return Err(Error::Invalid(format!(
                        "strict: WAIT's timeout ({wait} ms) must be >= 1 and below timeout_ms ({})",
                        opts.timeout_ms
                    )));
                }
                Some((st.replicas, wait))
            }
        };
        let source = match opts.backend {
            Backend::Auto => None,
            Backend::Module => None, // still asked once, to refuse a server without it
            Backend::Lua => Some(Source::Lua),
        };
        Ok(RateLimit {
            inner: Arc::new(Inner {
                conn,
                timeout: Duration::from_millis(opts.timeout_ms),
                wanted: opts.backend,
                chosen: Mutex::new(Chosen { source, found: None, cluster: None }),
                strict,
                breaker: BreakerState::new(opts.breaker),
                m: Counters::default(),
                epoch: Instant::now(),
            }),
        })
    }

    /// The chosen backend once known (after [`detect`](Self::detect) or a
    /// first call): `Source::Module` or `Source::Lua`.
    pub fn backend(&self) -> Option<Source> {
        self.inner.chosen().source
    }

    /// Finds out which backend the server offers (one call, bounded by the
    /// timeout, through the breaker).
    pub async fn detect(&self) -> Result<Source> {
        let inner = self.inner.clone();
        self.inner
            .bounded(false, async move {
                inner.ensure_detected().await?;
                inner.chosen().source.ok_or_else(|| Fail::Ours(Error::Protocol("no backend".into())))
            })
            .await
    }

    /// A limiter deciding every call on Redis (one bounded call per
    /// decision), with the panic limits `panic` while Redis is unavailable.
    pub fn limiter(&self, rule: impl Into<Rule>, panic: Panic) -> Result<Limiter<C>> {
        panic.check()?;
        let rule = Arc::new(rule.into());
        let panics = PanicBuckets::new(&panic, rule.parts(), 100_000);
        Ok(Limiter { rl: self.clone(), rule, panics: Arc::new(panics) })
    }

    /// The counters and the breaker's state.
    pub fn metrics(&self) -> Metrics {
        let m = &self.inner.m;
        let b = self.inner.breaker.counts();
        Metrics {
            decisions_module: m.module.load(Relaxed),
            decisions_lua: m.lua.load(Relaxed),
            decisions_local: m.local.load(Relaxed),
            decisions_panic: m.panic.load(Relaxed),
            denied: m.denied.load(Relaxed),
            calls: m.calls.load(Relaxed),
            failures: m.failures.load(Relaxed),
            leases: m.leases.load(Relaxed),
            lease_tokens: m.lease_tokens.load(Relaxed),
            lease_waits: m.lease_waits.load(Relaxed),
            refunds: m.refunds.load(Relaxed),
            refund_tokens: m.refund_tokens.load(Relaxed),
            trips: b.trips,
            trips_failures: b.trips_failures,
            trips_latency: b.trips_latency,
            probes_ok: b.probes_ok,
            probes_failed: b.probes_failed,
            redetects: m.redetects.load(Relaxed),
            unreplicated: m.unreplicated.load(Relaxed),
            state: self.inner.breaker.state(),
        }
    }
}

/// Why a module that lacks what `req` needs refuses it before any call
/// (a module older than `RL.MULTI` or `RL.FIXEDWINDOW`): an unknown
/// command would otherwise look like a failover to a server without it.
fn lacks(found: Option<Found>, req: &Request<'_>) -> Option<&'static str> {
    let f = found?;
    if req.is_multi() && !f.multi {
        Some("this server's redis-ratelimit module has no RL.MULTI (all_of needs it)")
    } else if req.fixed && !f.fixed {
        Some(
            "this server's redis-ratelimit module has no RL.FIXEDWINDOW (fixed_window needs it: \
             upgrade the module, or use Backend::Lua)",
        )
    } else {
        None
    }
}

impl<C: Connection> Inner<C> {
    pub(crate) fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64() * 1000.0
    }

    fn chosen(&self) -> Chosen {
        *self.chosen.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_chosen(&self, f: impl FnOnce(&mut Chosen)) {
        f(&mut self.chosen.lock().unwrap_or_else(|e| e.into_inner()))
    }

    async fn send(&self, cmd: &Cmd) -> std::result::Result<Value, RedisError> {
        let mut c = self.conn.clone();
        match c.req_packed_command(cmd).await? {
            Value::ServerError(e) => Err(e.into()),
            v => Ok(v),
        }
    }

    /// The backend, asked once (COMMAND INFO) unless it is known.
    async fn ensure_detected(&self) -> std::result::Result<(), Fail> {
        let c = self.chosen();
        if c.source == Some(Source::Lua) || c.found.is_some() {
            return Ok(());
        }
        let reply = self.send(redis::cmd("COMMAND").arg("INFO").arg(&DETECT[..])).await;
        let found = match reply {
            Ok(v) => detect_reply(&v).ok_or_else(|| Fail::Ours(Error::Protocol(format!("COMMAND INFO: {v:?}"))))?,
            // COMMAND refused (renamed, forbidden): no module as far as we can tell
            Err(e) if e.code().is_some() && !UNAVAILABLE.contains(&e.code().unwrap_or("")) => Found::default(),
            Err(e) => return Err(Fail::Redis(e)),
        };
        if self.wanted == Backend::Module && !found.module {
            return Err(Fail::Ours(Error::Unsupported(
                "the redis-ratelimit module is not loaded on this server (RL.TOKENBUCKET unknown)".into(),
            )));
        }
        self.set_chosen(|c| {
            if c.source.is_none() {
                c.source = Some(if found.module { Source::Module } else { Source::Lua });
            }
            c.found = Some(found);
        });
        Ok(())
    }

    /// One decision's call on the chosen backend (detection first when needed).
    pub(crate) async fn run(&self, req: &Request<'_>) -> std::result::Result<(Value, Source), Fail> {
        self.ensure_detected().await?;
        self.ensure_not_cluster().await?;
        let c = self.chosen();
        match c.source {
            Some(Source::Module) => {
                if let Some(why) = lacks(c.found, req) {
                    return Err(Fail::Ours(Error::Unsupported(why.into())));
                }
                match self.call(req, &req.module_cmd()).await {
                    Ok(v) => Ok((v, Source::Module)),
                    Err(Fail::Redis(e))
                        if e.to_string().to_ascii_lowercase().contains("unknown command")
                            && self.wanted == Backend::Auto =>
                    {
                        // the module was found and its command is now unknown: the
                        // server changed (a failover to one without it). A failure;
                        // the next call detects the backend again.
                        self.set_chosen(|c| *c = Chosen::default());
                        self.m.redetects.fetch_add(1, Relaxed);
                        Err(Fail::Redis(e))
                    }
                    Err(e) => Err(e),
                }
            }
            _ => match self.call(req, &req.lua_cmd(false)).await {
                Err(Fail::Redis(e)) if is_noscript(&e) => Ok((self.call(req, &req.lua_cmd(true)).await?, Source::Lua)),
                r => Ok((r?, Source::Lua)),
            },
        }
    }

    /// Strict mode refuses a cluster (asked once: `INFO cluster`).
    async fn ensure_not_cluster(&self) -> std::result::Result<(), Fail> {
        if self.strict.is_none() || self.chosen().cluster.is_some() {
            return Ok(());
        }
        let v = self.send(redis::cmd("INFO").arg("cluster")).await?;
        // a cluster connection asks every node: a map of node → text
        fn enabled(v: &Value) -> Option<bool> {
            let text = match v {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::VerbatimString { text, .. } => text.clone(),
                Value::SimpleString(t) => t.clone(),
                Value::Map(m) => return m.iter().map(|(_, v)| enabled(v)).try_fold(false, |a, x| Some(a || x?)),
                _ => return None,
            };
            Some(text.lines().any(|l| l.trim() == "cluster_enabled:1"))
        }
        let Some(cluster) = enabled(&v) else {
            return Err(Fail::Ours(Error::Protocol(format!("INFO cluster: {v:?}"))));
        };
        self.set_chosen(|c| c.cluster = Some(cluster));
        if cluster {
            return Err(Fail::Ours(Error::Unsupported(
                "strict mode is not supported on a Redis Cluster (WAIT has no key to route by)".into(),
            )));
        }
        Ok(())
    }

    /// `cmd`; in strict mode, when it can grant, in one pipeline with
    /// `WAIT replicas ms`: units it granted that fewer replicas
    /// acknowledged make the call a failure.
    async fn call(&self, req: &Request<'_>, cmd: &Cmd) -> std::result::Result<Value, Fail> {
        let Some((replicas, ms)) = self.strict.filter(|_| req.grants) else {
            return Ok(self.send(cmd).await?);
        };
        let mut p = redis::pipe();
        p.add_command(cmd.clone()).cmd("WAIT").arg(replicas).arg(ms);
        let mut c = self.conn.clone();
        let mut vals = c.req_packed_commands(&p, 0, 2).await?.into_iter();
        let (Some(v), Some(ack), None) = (vals.next(), vals.next(), vals.next()) else {
            return Err(Fail::Ours(Error::Protocol("a strict pipeline without two replies".into())));
        };
        let v = match v {
            Value::ServerError(e) => return Err(Fail::Redis(e.into())),
            v => v,
        };
        let ack = match ack {
            Value::Int(n) => n,
            Value::ServerError(e) => return Err(Fail::Redis(e.into())),
            other => return Err(Fail::Ours(Error::Protocol(format!("WAIT: {other:?}")))),
        };
        let granted = matches!(&v, Value::Array(a) if matches!(a.first(), Some(Value::Int(n)) if *n > 0));
        if granted && ack < replicas as i64 {
            return Err(Fail::Unreplicated(format!(
                "strict: WAIT {replicas} {ms} saw {ack} replica(s) acknowledge the grant: not granted"
            )));
        }
        Ok(v)
    }

    /// One Redis call through the breaker, bounded by the timeout.
    /// `Error::Unavailable` when the breaker refuses, on a timeout or a
    /// failed connection; error replies as `Error::Reply`.
    pub(crate) async fn bounded<T>(&self, probe: bool, f: impl Future<Output = std::result::Result<T, Fail>>) -> Result<T> {
        if !probe {
            match self.breaker.acquire(self.now()) {
                Permit::Yes => {}
                Permit::No => return Err(Error::Unavailable("circuit breaker open".into())),
                Permit::Probe => {
                    // a probe found due here goes on with this call; the
                    // limiters send theirs in the background instead
                    return Box::pin(self.bounded_inner(true, f)).await;
                }
            }
        }
        self.bounded_inner(probe, f).await
    }

    pub(crate) async fn bounded_inner<T>(
        &self,
        probe: bool,
        f: impl Future<Output = std::result::Result<T, Fail>>,
    ) -> Result<T> {
        let t0 = self.now();
        self.m.calls.fetch_add(1, Relaxed);
        let r = tokio::time::timeout(self.timeout, f).await;
        let t1 = self.now();
        let fail = |msg: String| {
            self.m.failures.fetch_add(1, Relaxed);
            self.breaker.failure(t1, probe);
            Err(Error::Unavailable(msg))
        };
        match r {
            Err(_) => fail(format!("no reply from Redis within {} ms", self.timeout.as_millis())),
            Ok(Ok(v)) => {
                self.breaker.success(t1 - t0, t1, probe);
                Ok(v)
            }
            Ok(Err(Fail::Ours(e))) => {
                self.breaker.success(t1 - t0, t1, probe); // it answered: it is up
                Err(e)
            }
            Ok(Err(Fail::Unreplicated(msg))) => {
                self.m.unreplicated.fetch_add(1, Relaxed);
                fail(msg)
            }
            Ok(Err(Fail::Redis(e))) => {
                let unknown = e.to_string().to_ascii_lowercase().contains("unknown command");
                match e.code() {
                    Some(code) if !(UNAVAILABLE.contains(&code) || unknown && self.wanted == Backend::Auto) => {
                        self.breaker.success(t1 - t0, t1, probe);
                        Err(Error::Reply(e.to_string()))
                    }
                    _ => fail(format!("Redis call failed: {e}")),
                }
            }
        }
    }

    pub(crate) fn count(&self, d: Decision) -> Decision {
        let c = match d.source {
            Source::Module => &self.m.module,
            Source::Lua => &self.m.lua,
            Source::Local => &self.m.local,
            Source::Panic => &self.m.panic,
        };
        c.fetch_add(1, Relaxed);
        if !d.allowed {
            self.m.denied.fetch_add(1, Relaxed);
        }
        d
    }
}

/// The options of one decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// Units asked for (default 1; 0 asks without taking).
    pub cost: u64,
    /// Take what is available (0…cost) instead of all or nothing.
    pub partial: bool,
    /// Decide without taking anything.
    pub dry_run: bool,
}

impl Default for Call {
    fn default() -> Call {
        Call { cost: 1, partial: false, dry_run: false }
    }
}

impl Call {
    /// A call of `cost` units, all or nothing.
    pub fn cost(cost: u64) -> Call {
        Call { cost, ..Call::default() }
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
        let n = self.rule.parts().len();
        if !matches!(&*self.rule, Rule::AllOf(_)) || keys.len() != n {
            return Err(Error::Invalid(format!("{:?} needs {n} keys, got {}", self.rule.name(), keys.len())));
        }
        for (i, k) in keys.iter().enumerate() {
            if keys[..i].contains(k) {
                return Err(Error::Invalid("the keys of an all_of call must be distinct".into()));
            }
        }
        assert_same_slot(keys)?;
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

    fn request<'k>(&self, keys: Vec<Cow<'k, str>>, tail: Tail) -> Request<'k> {
        match &*self.rule {
            Rule::Single(p) => Request::single_of(p, keys, tail),
            Rule::AllOf(a) => Request::multi(a.parts(), keys, tail),
        }
    }

    async fn decide(&self, keys: Vec<Cow<'_, str>>, call: Call) -> Result<Decision> {
        check_int("cost", call.cost, 0)?;
        let inner = &self.rl.inner;
        let tail = Tail::Call { cost: call.cost, partial: call.partial, dry_run: call.dry_run };
        match inner.breaker.acquire(inner.now()) {
            Permit::Yes => {}
            Permit::No => return Ok(inner.count(self.panic(&keys, call))),
            Permit::Probe => {
                // the probe goes out in the background (the same call as a
                // DRYRUN: it takes nothing); this caller is answered now
                let probe_req = self
                    .request(keys.clone(), Tail::Call { cost: call.cost, partial: call.partial, dry_run: true })
                    .into_owned();
                let bg = inner.clone();
                tokio::spawn(async move {
                    let i2 = bg.clone();
                    let _ = bg.bounded(true, async move { i2.run(&probe_req).await }).await;
                });
                return Ok(inner.count(self.panic(&keys, call)));
            }
        }
        // the panic limits, if Redis does not answer, take the request's own keys
        let req = self.request(keys, tail);
        let r = inner.bounded_inner(false, inner.run(&req)).await;
        match r {
            Ok((v, source)) => Ok(inner.count(self.decode(&v, call.cost, call.partial, source)?)),
            Err(Error::Unavailable(_)) => Ok(inner.count(self.panic(&req.keys, call))),
            Err(e) => Err(e),
        }
    }

    /// Gives `n` units back to `key` (REFUND); `granted` = units given back.
    /// `Error::Unavailable` when Redis is (no panic limits for refunds).
    pub async fn refund(&self, key: &str, n: u64) -> Result<Decision> {
        check_int("refund", n, 1)?;
        let keys = self.keys_for(key)?;
        let inner = &self.rl.inner;
        let req = self.request(keys, Tail::Refund(n));
        let (v, source) = inner.bounded(false, inner.run(&req)).await?;
        let mut d = self.decode(&v, n, true, source)?;
        d.allowed = true;
        inner.m.refunds.fetch_add(1, Relaxed);
        inner.m.refund_tokens.fetch_add(d.granted, Relaxed);
        Ok(d)
    }

    fn decode(&self, v: &Value, cost: u64, partial: bool, source: Source) -> Result<Decision> {
        let bad = || Error::Protocol(format!("{v:?}"));
        let Value::Array(a) = v else { return Err(bad()) };
        let granted_of = |x: u64| {
            if partial {
                x
            } else if x == 1 {
                cost
            } else {
                0
            }
        };
        match &*self.rule {
            Rule::Single(p) => {
                if a.len() != 5 {
                    return Err(bad());
                }
                let granted = granted_of(uint(&a[0])?);
                Ok(Decision {
                    allowed: granted == cost,
                    granted,
                    limit: uint(&a[1])?,
                    remaining: uint(&a[2])?,
                    retry_after_ms: int(&a[3])?,
                    reset_after_ms: uint(&a[4])?,
                    policy: p.name().to_owned(),
                    binding: p.name().to_owned(),
                    source,
                    parts: Vec::new(),
                    rule: self.rule.clone(),
                })
            }
            Rule::AllOf(all) => {
                let n = all.parts().len();
                let (7, Value::Array(ps)) = (a.len(), a.get(6).unwrap_or(&Value::Nil)) else { return Err(bad()) };
                if ps.len() != n {
                    return Err(bad());
                }
                let mut parts = Vec::with_capacity(n);
                for (p, pol) in ps.iter().zip(all.parts()) {
                    let Value::Array(x) = p else { return Err(bad()) };
                    if x.len() < 5 {
                        return Err(bad());
                    }
                    parts.push(Part {
                        policy: pol.name().to_owned(),
                        granted: uint(&x[0])?,
                        limit: uint(&x[1])?,
                        remaining: uint(&x[2])?,
                        retry_after_ms: int(&x[3])?,
                        reset_after_ms: uint(&x[4])?,
                    });
                }
                let bi = usize::try_from(uint(&a[5])?).ok().filter(|&b| b < n).ok_or_else(bad)?;
                let granted = granted_of(uint(&a[0])?);
                Ok(Decision {
                    allowed: granted == cost,
                    granted,
                    limit: uint(&a[1])?,
                    remaining: uint(&a[2])?,
                    retry_after_ms: int(&a[3])?,
                    reset_after_ms: uint(&a[4])?,
                    policy: all.name().to_owned(),
                    binding: all.parts()[bi].name().to_owned(),
                    source,
                    parts,
                    rule: self.rule.clone(),
                })
            }
        }
    }

    /// A decision from the panic limits (all parts, all or nothing).
    fn panic(&self, keys: &[Cow<'_, str>], call: Call) -> Decision {
        let pp = self.rule.parts();
        let weights: Vec<u64> = match &*self.rule {
            Rule::Single(_) => vec![1],
            Rule::AllOf(_) => pp.iter().map(|p| p.weight()).collect(),
        };
        let now = self.rl.inner.now();
        let res = self.panics.decide(keys, call.cost, &weights, call.partial, call.dry_run, now);
        let g = res[0].took / weights[0].max(1);
        let allowed = g == call.cost;
        let b = if let Rule::Single(_) = &*self.rule {
            0
        } else if allowed {
            (0..res.len()).min_by_key(|&i| (res[i].remaining / weights[i].max(1), i)).unwrap_or(0)
        } else {
            (0..res.len()).max_by_key(|&i| (res[i].retry_ms < 0, res[i].retry_ms, std::cmp::Reverse(i))).unwrap_or(0)
        };
        let retry = if allowed {
            0
        } else if res.iter().any(|r| r.retry_ms < 0) {
            -1
        } else {
            res.iter().map(|r| r.retry_ms).max().unwrap_or(1).max(1)
        };
        let parts = match &*self.rule {
            Rule::Single(_) => Vec::new(),
            Rule::AllOf(_) => res
                .iter()
                .zip(pp)
                .map(|(r, p)| Part {
                    policy: p.name().to_owned(),
                    granted: r.took,
                    limit: r.cap,
                    remaining: r.remaining,
                    retry_after_ms: r.retry_ms,
                    reset_after_ms: r.reset_ms,
                })
                .collect(),
        };
        Decision {
            allowed,
            granted: g,
            limit: res[b].cap,
            remaining: res[b].remaining,
            retry_after_ms: retry,
            reset_after_ms: res[b].reset_ms,
            policy: self.rule.name().to_owned(),
            binding: pp[b].name().to_owned(),
            source: Source::Panic,
            parts,
            rule: self.rule.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{fixed_window, sliding_log};

    #[test]
    fn an_older_module_refuses_what_it_lacks_before_any_call() {
        let fw = fixed_window("f", 5, 1000, false).unwrap();
        let sl = sliding_log("s", 5, 1000).unwrap();
        let single_fw = Request::single(&fw, "k", Tail::Refund(1));
        let multi_fw = Request::multi(&[sl.clone(), fw], vec!["a".into(), "b".into()], Tail::Refund(1));
        let multi_sl = Request::multi(std::slice::from_ref(&sl), vec!["a".into()], Tail::Refund(1));
        let single_sl = Request::single(&sl, "k", Tail::Refund(1));
        let all = Some(Found { module: true, multi: true, fixed: true });
        let no_fixed = Some(Found { module: true, multi: true, fixed: false });
        let no_multi = Some(Found { module: true, multi: false, fixed: false });
        for r in [&single_fw, &multi_fw, &multi_sl, &single_sl] {
            assert_eq!(lacks(all, r), None);
            assert_eq!(lacks(None, r), None);
        }
        assert!(lacks(no_fixed, &single_fw).unwrap().contains("RL.FIXEDWINDOW"));
        assert!(lacks(no_fixed, &multi_fw).unwrap().contains("RL.FIXEDWINDOW"));
        assert_eq!(lacks(no_fixed, &multi_sl), None);
        assert!(lacks(no_multi, &multi_sl).unwrap().contains("RL.MULTI"));
        assert_eq!(lacks(no_multi, &single_sl), None);
    }
}
