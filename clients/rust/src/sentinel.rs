//! A connection that follows Sentinel: [`SentinelConnection`].
//!
//! It asks the sentinels for the primary of a service (redis-rs's
//! `SentinelClient`), keeps one multiplexed connection to it, and forgets
//! that connection when a call on it fails, finds the server read-only (a
//! demoted primary), or is abandoned before its reply (the library's
//! timeout on a stalled primary). The next call asks the sentinels again,
//! so after a failover the calls go to the promoted replica. Every call,
//! the sentinels' answer included, stays inside the library's timeout: a
//! decision never waits for a reconnect longer than that, and while the
//! sentinels still name a dead primary the breaker and panic limits decide.

use std::sync::{Arc, Mutex};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use crate::error::{Error, Result};

struct Shared {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Option<MultiplexedConnection>>,
}

/// A redis-rs async connection to the primary of a Sentinel service that
/// follows failovers (see the module documentation). Give it to
/// [`RateLimit::new`](crate::RateLimit::new). Cheap to clone: the clones
/// share the connection.
#[derive(Clone)]
pub struct SentinelConnection {
    sh: Arc<Shared>,
}

impl SentinelConnection {
    /// `sentinels`: their URLs (`redis://host:26379`); `service`: the name
    /// they monitor (`mymaster`). Nothing is connected until the first call.
    pub fn new<T: AsRef<str>>(sentinels: &[T], service: &str) -> Result<SentinelConnection> {
        SentinelConnection::with_node_settings(sentinels, service, None)
    }

    /// [`new`](Self::new), with the settings of the connections to the
    /// primary (its username and password, its database): `node`. The
    /// sentinels' own password goes in their URLs (`redis://:pass@host:port`).
    pub fn with_node_settings<T: AsRef<str>>(
        sentinels: &[T],
        service: &str,
        node: Option<redis::RedisConnectionInfo>,
    ) -> Result<SentinelConnection> {
        if sentinels.is_empty() {
            return Err(Error::Invalid("SentinelConnection needs at least one sentinel".into()));
        }
        let urls: Vec<String> = sentinels.iter().map(|s| s.as_ref().to_owned()).collect();
        let node = node.map(|n| redis::sentinel::SentinelNodeConnectionInfo::default().set_redis_connection_info(n));
        // redis-rs takes a String here without its TLS features and any
        // AsRef<str> with them (as the service builds it): a String fits both
        #[allow(clippy::unnecessary_to_owned)]
        let client = SentinelClient::build(urls, service.to_owned(), node, SentinelServerType::Master)
            .map_err(|e| Error::Invalid(format!("sentinels: {e}")))?;
        Ok(SentinelConnection::from_client(client))
    }

    /// A connection over a `SentinelClient` built by the caller, e.g. with
    /// redis-rs's `SentinelClientBuilder` for TLS to the sentinels and the
    /// primary (its certificates). It should name a primary
    /// (`SentinelServerType::Master`): a replica refuses the decisions' writes.
    pub fn from_client(client: SentinelClient) -> SentinelConnection {
        SentinelConnection { sh: Arc::new(Shared { sentinels: tokio::sync::Mutex::new(client), current: Mutex::new(None) }) }
    }

    fn current(&self) -> Option<MultiplexedConnection> {
        self.sh.current.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn forget(&self) {
        *self.sh.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    async fn connection(&self) -> redis::RedisResult<MultiplexedConnection> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let c = self.sh.sentinels.lock().await.get_async_connection().await?;
        *self.sh.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(c.clone());
        Ok(c)
    }
}

/// Forgets the connection unless disarmed: a call dropped before its reply
/// (the library's timeout) leaves the next call to ask the sentinels.
struct Pending<'a> {
    conn: &'a SentinelConnection,
    armed: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.conn.forget();
        }
    }
}

/// Error replies of a server that is no longer (or not yet) the primary.
const NOT_PRIMARY: [&str; 3] = ["READONLY", "MASTERDOWN", "LOADING"];

/// Whether the connection should be dropped after this outcome: a failed
/// connection, or a server that is no longer the primary.
fn stale(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.code().is_some_and(|c| NOT_PRIMARY.contains(&c))
}

fn stale_value(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if NOT_PRIMARY.contains(&e.code()))
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut guard = Pending { conn: self, armed: true };
            let r = match guard.conn.connection().await {
                Ok(mut c) => c.req_packed_command(cmd).await,
                Err(e) => Err(e),
            };
            guard.armed = match &r {
                Ok(v) => stale_value(v),
                Err(e) => stale(e),
            };
            r
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut guard = Pending { conn: self, armed: true };
            let r = match guard.conn.connection().await {
                Ok(mut c) => c.req_packed_commands(pipeline, offset, count).await,
                Err(e) => Err(e),
            };
            guard.armed = match &r {
                Ok(vs) => vs.iter().any(stale_value),
                Err(e) => stale(e),
            };
            r
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
