//! The transport of a [`RateLimit`](crate::RateLimit): its one connection,
//! the backend detection (`COMMAND INFO`, again after a failover to a
//! server without the module), strict mode's `WAIT` and cluster probe, and
//! every Redis call bounded by the library's own timeout
//! (`tokio::time::timeout` around the driver's future, whatever the driver
//! does meanwhile: reconnects, retries) through the circuit breaker. What
//! it sends and how replies read are the I/O-free modules' (`request`,
//! `answer`).

use std::future::Future;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};

use crate::breaker::{BreakerState, Permit};
use crate::decision::Source;
use crate::error::{Error, Result};
use crate::metrics::Counters;
use crate::options::Options;
use crate::request::{detect, detect_reply, lacks, Backend, Found, Request};

/// A connection the library can send through: any async redis-rs
/// connection (`ConnectionManager`, `MultiplexedConnection`), cloned per call.
pub trait Connection: ConnectionLike + Clone + Send + Sync + 'static {}
impl<T: ConnectionLike + Clone + Send + Sync + 'static> Connection for T {}

#[derive(Debug, Clone, Copy, Default)]
struct Chosen {
    source: Option<Source>, // Module or Lua once known
    /// The module's commands, once asked (`None`: not asked yet).
    found: Option<Found>,
    /// Strict mode: whether the server is a cluster node, once asked.
    cluster: Option<bool>,
}

/// One connection's transport, shared (in an `Arc`) by a `RateLimit`, its
/// limiters and their background calls.
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

impl<C> Inner<C> {
    /// The transport of `conn` with `opts` (refused when out of range).
    pub(crate) fn new(conn: C, opts: Options) -> Result<Inner<C>> {
        let strict = opts.check()?;
        let source = match opts.backend {
            Backend::Auto => None,
            Backend::Module => None, // still asked once, to refuse a server without it
            Backend::Lua => Some(Source::Lua),
        };
        Ok(Inner {
            conn,
            timeout: Duration::from_millis(opts.timeout_ms),
            wanted: opts.backend,
            chosen: Mutex::new(Chosen { source, found: None, cluster: None }),
            strict,
            breaker: BreakerState::new(opts.breaker),
            m: Counters::default(),
            epoch: Instant::now(),
        })
    }

    /// Milliseconds on this transport's monotonic clock.
    pub(crate) fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64() * 1000.0
    }

    /// The chosen backend once known.
    pub(crate) fn source(&self) -> Option<Source> {
        self.chosen().source
    }

    fn chosen(&self) -> Chosen {
        *self.chosen.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_chosen(&self, f: impl FnOnce(&mut Chosen)) {
        f(&mut self.chosen.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl<C: Connection> Inner<C> {
    async fn send(&self, cmd: &Cmd) -> std::result::Result<Value, RedisError> {
        let mut c = self.conn.clone();
        match c.req_packed_command(cmd).await? {
            Value::ServerError(e) => Err(e.into()),
            v => Ok(v),
        }
    }

    /// The backend, asked once (COMMAND INFO) unless it is known.
    pub(crate) async fn ensure_detected(&self) -> std::result::Result<(), Fail> {
        let c = self.chosen();
        if c.source == Some(Source::Lua) || c.found.is_some() {
            return Ok(());
        }
        let reply = self.send(redis::cmd("COMMAND").arg("INFO").arg(&detect()[..])).await;
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
}
