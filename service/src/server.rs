//! The listeners: gRPC (`RateLimitService/ShouldRateLimit` and the gRPC
//! health service) on `GRPC_HOST:GRPC_PORT`, HTTP (`POST /json`,
//! `GET /healthcheck`) on `HOST:PORT`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use redis_ratelimit_client::{Breaker, Connection, Options};
use tonic::transport::server::TcpIncoming;

use crate::conn::RedisConn;
use crate::connage::aged;
use crate::json::{parse_request, render_response};
use crate::runtime::{load_dir, spawn_reloader};
use crate::service::{Service, ServiceError};
use crate::settings::{RedisTls, RedisType, Settings};

/// The gRPC face of a [`Service`].
pub struct Grpc<C>(pub Arc<Service<C>>);

#[tonic::async_trait]
impl<C: Connection> RateLimitService for Grpc<C> {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        // TRACING_ENABLED: a sampled request's spans (crate::trace); else nothing more
        if let Some(t) = self.0.tracer() {
            if let Some(span) = t.begin(request.metadata(), request.remote_addr()) {
                let exec_start = crate::trace::now_ns();
                let mut redis = crate::trace::RedisCall::default();
                let r = grpc_answer(self.0.should_rate_limit_traced(request.get_ref(), Some(&mut redis)).await);
                let (code, msg) = match &r {
                    Ok(_) => (tonic::Code::Ok, ""),
                    Err(s) => (s.code(), s.message()),
                };
                t.end(span, request.get_ref(), exec_start, redis, code, msg);
                return r;
            }
        }
        grpc_answer(self.0.should_rate_limit(request.get_ref()).await)
    }
}

fn grpc_answer(r: Result<RateLimitResponse, ServiceError>) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
    match r {
        Ok(r) => Ok(tonic::Response::new(r)),
        Err(ServiceError::Invalid(m)) => Err(tonic::Status::invalid_argument(m)),
        Err(ServiceError::Unavailable(m)) => Err(tonic::Status::unavailable(m)),
        Err(ServiceError::Internal(m)) => Err(tonic::Status::internal(m)),
    }
}

async fn json_handler<C: Connection>(State(svc): State<Arc<Service<C>>>, body: Bytes) -> Response {
    let req = match parse_request(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, e).into_response(),
    };
    match svc.should_rate_limit(&req).await {
        // any error is a 400, as envoyproxy/ratelimit answers
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
        Ok(r) => {
            let status =
                if r.overall_code == Code::OverLimit as i32 { StatusCode::TOO_MANY_REQUESTS } else { StatusCode::OK };
            (status, [(header::CONTENT_TYPE, "application/json")], render_response(&r).to_string()).into_response()
        }
    }
}

/// The HTTP router: `POST /json`, `GET /healthcheck` (always OK; a
/// started service answers [`health_router`]'s instead).
pub fn http_router<C: Connection>(svc: Arc<Service<C>>) -> axum::Router {
    axum::Router::new().route("/json", post(json_handler::<C>)).route("/healthcheck", get(|| async { "OK" })).with_state(svc)
}

/// The health of a started service, as envoyproxy/ratelimit keeps it:
/// healthy while Redis is (with `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`),
/// a configuration with a domain is live (with
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`), and no SIGTERM came. `GET /healthcheck` answers 200 `OK` or 500; the
/// gRPC health service SERVING or NOT_SERVING for `""`, `ratelimit` and
/// the RateLimitService's full name.
pub struct Health {
    redis_down: std::sync::atomic::AtomicBool,
    stopping: std::sync::atomic::AtomicBool,
    no_config: std::sync::atomic::AtomicBool,
    reporter: tonic_health::server::HealthReporter,
    // one update at a time: the reporter's status is the last one computed
    lock: tokio::sync::Mutex<()>,
}

/// The gRPC health service's names of the service.
const HEALTH_NAMES: [&str; 3] = ["", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"];

impl Health {
    /// Healthy now.
    pub fn ok(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        !self.redis_down.load(SeqCst) && !self.stopping.load(SeqCst) && !self.no_config.load(SeqCst)
    }

    async fn publish(&self) {
        let _g = self.lock.lock().await;
        let status = if self.ok() { tonic_health::ServingStatus::Serving } else { tonic_health::ServingStatus::NotServing };
        for name in HEALTH_NAMES {
            self.reporter.set_service_status(name, status).await;
        }
    }

    /// Redis answered (`true`) or did not.
    pub async fn set_redis(&self, up: bool) {
        if self.redis_down.swap(!up, std::sync::atomic::Ordering::SeqCst) == up {
            self.publish().await;
        }
    }

    /// The live configuration has a domain (`true`) or has none.
    pub async fn set_config(&self, has_domains: bool) {
        if self.no_config.swap(!has_domains, std::sync::atomic::Ordering::SeqCst) == has_domains {
            self.publish().await;
        }
    }

    /// The service is stopping (SIGTERM): unhealthy from now on.
    pub async fn set_stopping(&self) {
        self.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        self.publish().await;
    }
}

/// `GET /healthcheck` of a started service: 200 `OK` while healthy, else 500.
pub fn health_router(health: Arc<Health>) -> axum::Router {
    axum::Router::new().route(
        "/healthcheck",
        get(move || {
            let h = health.clone();
            async move {
                if h.ok() {
                    (StatusCode::OK, "OK")
                } else {
                    (StatusCode::INTERNAL_SERVER_ERROR, "unhealthy")
                }
            }
        }),
    )
}

/// The Prometheus router: the statistics in the text exposition format on `path`.
pub fn metrics_router<C: Connection>(svc: Arc<Service<C>>, path: &str) -> axum::Router {
    axum::Router::new()
        .route(
            path,
            get(|State(svc): State<Arc<Service<C>>>| async move {
                ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], svc.render_metrics())
            }),
        )
        .with_state(svc)
}

/// The gRPC listener: `GRPC_HOST:GRPC_PORT`, or `GRPC_UDS`.
enum GrpcListener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

/// A started service: its state, the bound addresses, and the task serving both listeners.
pub struct Running {
    /// The service (its live configuration, its last refusal).
    pub service: Arc<Service<RedisConn>>,
    /// The gRPC listener's address (0.0.0.0:0 with `GRPC_UDS`).
    pub grpc_addr: std::net::SocketAddr,
    /// The HTTP listener's address.
    pub http_addr: std::net::SocketAddr,
    /// The Prometheus listener's address (`USE_PROMETHEUS=true`).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The debug listener's address (`DEBUG_HOST:DEBUG_PORT`: [`crate::debug`]).
    pub debug_addr: std::net::SocketAddr,
    /// Serves until aborted, a listener fails, or [`stop`](Self::stop)
    /// has let every in-flight request finish.
    pub task: tokio::task::JoinHandle<Result<(), String>>,
    /// The health both checks answer.
    pub health: Arc<Health>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Running {
    /// Both health checks fail from now on; the listeners stop accepting,
    /// the gRPC connections get GOAWAY, and [`task`](Self::task) ends once
    /// the requests in flight are answered.
    pub async fn stop(&self) {
        self.health.set_stopping().await;
        let _ = self.stop.send(true);
    }
}

/// How long a stopping service waits for its requests in flight before it
/// exits anyway.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

/// [`connect`], retried as envoyproxy/ratelimit retries at startup: after
/// `REDIS_STARTUP_INITIAL_INTERVAL`, each wait 1.5 times the last up to
/// `REDIS_STARTUP_MAX_INTERVAL`, for ever unless
/// `REDIS_STARTUP_MAX_ELAPSED_TIME` is set (then the last error).
async fn connect_with_retries(settings: &Settings) -> Result<RedisConn, String> {
    let (initial, max, max_elapsed) = settings.redis_startup;
    let began = tokio::time::Instant::now();
    let mut wait = initial;
    loop {
        match connect(settings).await {
            Ok(c) => return Ok(c),
            Err(e) => {
                if !max_elapsed.is_zero() && began.elapsed() + wait > max_elapsed {
                    return Err(e);
                }
                log!(crate::logger::Level::Warn, "{e}; retrying in {wait:?} (REDIS_STARTUP_*)");
                tokio::time::sleep(wait).await;
                wait = wait.mul_f64(1.5).min(max);
            }
        }
    }
}

/// The connection of `REDIS_TYPE`, connected (single, cluster) or with
/// its primary checked (sentinel) within `REDIS_TIMEOUT`; over TLS with
/// `REDIS_TLS`.
async fn connect(settings: &Settings) -> Result<RedisConn, String> {
    if settings.redis_tls.is_some() {
        // rustls's crypto: ring (the only provider built); a no-op when installed already
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let t = settings.redis_timeout;
    let over = if settings.redis_tls.is_some() { " over TLS (REDIS_TLS=true)" } else { "" };
    let late = || format!("connecting to Redis{over}: no connection within REDIS_TIMEOUT ({t:?})");
    let failed = |e: redis::RedisError| format!("connecting to Redis{over}: {e}");
    let conn = match &settings.redis_type {
        RedisType::Single => {
            let client = settings.redis_client()?;
            // one attempt first, so that a refusal or a failed TLS handshake
            // is the error, not the manager's retries running out the time
            let first = redis::AsyncConnectionConfig::new().set_connection_timeout(Some(t)).set_response_timeout(Some(t));
            drop(
                tokio::time::timeout(t, client.get_multiplexed_async_connection_with_config(&first))
                    .await
                    .map_err(|_| late())?
                    .map_err(failed)?,
            );
            let mgr_cfg =
                redis::aio::ConnectionManagerConfig::new().set_connection_timeout(Some(t)).set_response_timeout(Some(t));
            let c = tokio::time::timeout(t, redis::aio::ConnectionManager::new_with_config(client, mgr_cfg))
                .await
                .map_err(|_| late())?
                .map_err(failed)?;
            RedisConn::Single(c)
        }
        RedisType::Sentinel { master, .. } => {
            let c = match &settings.redis_tls {
                None => {
                    let node = settings.redis_info().redis_settings().clone();
                    redis_ratelimit_client::SentinelConnection::with_node_settings(
                        &settings.redis_urls(),
                        master,
                        Some(node),
                    )
                    .map_err(|e| format!("REDIS_URL: {e}"))?
                }
                Some(tls) => sentinel_tls(settings, master, tls)?,
            };
            RedisConn::Sentinel(c)
        }
        RedisType::Cluster { .. } => {
            let mut builder =
                redis::cluster::ClusterClient::builder(settings.redis_urls()).connection_timeout(t).response_timeout(t);
            if let Some(tls) = &settings.redis_tls {
                builder = builder.certs(tls.certificates()).danger_accept_invalid_hostnames(tls.skip_hostname_verification);
            }
            let client = builder.build().map_err(|e| format!("REDIS_URL: {e}"))?;
            let c = tokio::time::timeout(t, client.get_async_connection()).await.map_err(|_| late())?.map_err(failed)?;
            RedisConn::Cluster(c)
        }
    };
    // the first call is bounded too: no Redis within REDIS_TIMEOUT, no start
    let mut probe = conn.clone();
    tokio::time::timeout(t, redis::cmd("PING").query_async::<String>(&mut probe))
        .await
        .map_err(|_| late())?
        .map_err(failed)?;
    Ok(conn)
}

/// `REDIS_TYPE=sentinel` with `REDIS_TLS`: TLS to the sentinels and to the
/// primary they name, with the same certificates (as envoyproxy/ratelimit).
fn sentinel_tls(
    settings: &Settings,
    master: &str,
    tls: &RedisTls,
) -> Result<redis_ratelimit_client::SentinelConnection, String> {
    use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
    use redis::IntoConnectionInfo;
    let RedisType::Sentinel { sentinels, .. } = &settings.redis_type else {
        return Err("REDIS_TYPE is not sentinel".into());
    };
    let mut addrs = Vec::with_capacity(sentinels.len());
    for a in sentinels {
        let info = format!("rediss://{a}/").into_connection_info().map_err(|e| format!("REDIS_URL {a:?}: {e}"))?;
        addrs.push(info.addr().clone());
    }
    let nodelay = redis::io::tcp::TcpSettings::default().set_nodelay(true);
    let mut b = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)
        .map_err(|e| format!("REDIS_URL: {e}"))?
        .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure)
        .set_client_to_sentinel_certificates(tls.certificates())
        .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
        .set_client_to_redis_certificates(tls.certificates())
        .set_client_to_redis_tcp_settings(nodelay);
    if let Some((user, pass)) = &settings.redis_sentinel_auth {
        b = b.set_client_to_sentinel_password(pass);
        if let Some(u) = user {
            b = b.set_client_to_sentinel_username(u);
        }
    }
    if let Some((user, pass)) = &settings.redis_auth {
        b = b.set_client_to_redis_password(pass);
        if let Some(u) = user {
            b = b.set_client_to_redis_username(u);
        }
    }
    let client = b.build().map_err(|e| format!("REDIS_TLS: {e}"))?;
    Ok(redis_ratelimit_client::SentinelConnection::from_client(client))
}

/// HTTP/2 streams a gRPC client may have open on one connection (the
/// server's SETTINGS_MAX_CONCURRENT_STREAMS). tonic leaves it unlimited, and
/// h2 closes a connection (GOAWAY ENHANCE_YOUR_CALM, "too_many_data_frames")
/// once more small DATA frames wait unread than its budget allows: half the
/// 1 MiB connection window, a frame charged up to 256 bytes, so 2,048 request
/// bodies. A burst beyond the service's CPU did that: at 90,000 requests/s
/// offered on 4 connections every connection was closed and 247,636 of
/// 270,000 requests failed with a transport error. With 1,024 streams a
/// connection's unread bodies stay within half the budget; the client
/// queues the rest (Envoy opens another connection).
pub const MAX_CONCURRENT_STREAMS: u32 = 1024;

/// Streams a client may reset before the service has taken them up, at
/// once, before h2 closes the connection (its guard against rapid reset).
/// h2's default is 20: when the service stalled (its CPU) while the client
/// gave up on requests (Envoy's timeout, 20 ms by default, resets each),
/// more than 20 resets arrived together and every other request on the
/// connection failed with it (300 of 300 in the service suite). 4,096 is a
/// stall of 400 ms at 10,000 requests/s on one connection; a client that
/// resets without end still meets the guard.
pub const MAX_PENDING_RESETS: usize = 4096;

/// The client of the decisions on `settings`' Redis, and a connection of its own for the health probe.
async fn rate_limiter(settings: &Settings) -> Result<(redis_ratelimit_client::RateLimit<RedisConn>, RedisConn), String> {
    let conn = connect_with_retries(settings).await?;
    let probe = conn.clone();
    let timeout_ms = u64::try_from(settings.redis_timeout.as_millis()).unwrap_or(u64::MAX).max(1);
    // A decision Redis gives within REDIS_TIMEOUT, however slow, is a
    // decision: the breaker's latency budget is REDIS_TIMEOUT itself, not the
    // client's 50 ms default, which a saturated service's own queueing
    // exceeds (it opened and answered UNAVAILABLE for a second under load).
    // Timeouts and errors still open it after 5 in a row.
    let breaker = Breaker { latency_budget_ms: timeout_ms as f64, ..Breaker::default() };
    let rl = redis_ratelimit_client::RateLimit::new(
        conn,
        Options { timeout_ms, backend: redis_ratelimit_client::Backend::Auto, breaker, ..Options::default() },
    )
    .map_err(|e| e.to_string())?;
    Ok((rl, probe))
}

/// The first configuration: the files' (`None` with xDS, which sends one
/// later), and the load error FORCE_START_WITHOUT_INITIAL_CONFIG served
/// without (every domain unknown).
type FirstConfig = (crate::config::Config, Option<crate::runtime::Files>, Option<String>);

fn first_config(settings: &Settings) -> Result<FirstConfig, String> {
    if settings.xds.is_some() {
        return Ok((crate::config::Config::default(), None, None));
    }
    match load_dir(settings) {
        Ok((cfg, files)) => Ok((cfg, Some(files), None)),
        Err(e) if settings.force_start => {
            log!(
                crate::logger::Level::Error,
                "config refused: {e}; serving without a configuration (FORCE_START_WITHOUT_INITIAL_CONFIG)"
            );
            Ok((crate::config::Config::default(), Some(Vec::new()), Some(e)))
        }
        Err(e) => Err(format!("config refused: {e}")),
    }
}

/// The bound listeners and their addresses.
struct Listeners {
    grpc: GrpcListener,
    grpc_addr: std::net::SocketAddr,
    http: tokio::net::TcpListener,
    http_addr: std::net::SocketAddr,
    metrics: Option<tokio::net::TcpListener>,
    metrics_addr: Option<std::net::SocketAddr>,
}

async fn bind(settings: &Settings) -> Result<Listeners, String> {
    let grpc_addr = format!("{}:{}", settings.grpc_host, settings.grpc_port);
    let http_addr = format!("{}:{}", settings.host, settings.port);
    let grpc = match &settings.grpc_uds {
        Some(path) => {
            // a socket left by a previous process; anything else is not removed
            if std::fs::symlink_metadata(path).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type())) {
                let _ = std::fs::remove_file(path);
            }
            GrpcListener::Unix(
                tokio::net::UnixListener::bind(path).map_err(|e| format!("GRPC_UDS {}: {e}", path.display()))?,
            )
        }
        None => GrpcListener::Tcp(
            tokio::net::TcpListener::bind(&grpc_addr).await.map_err(|e| format!("GRPC_PORT {grpc_addr}: {e}"))?,
        ),
    };
    let http = tokio::net::TcpListener::bind(&http_addr).await.map_err(|e| format!("PORT {http_addr}: {e}"))?;
    let grpc_addr = match &grpc {
        GrpcListener::Tcp(l) => l.local_addr().map_err(|e| e.to_string())?,
        GrpcListener::Unix(_) => std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
    };
    let http_addr = http.local_addr().map_err(|e| e.to_string())?;
    let metrics = match &settings.prometheus {
        None => None,
        Some((addr, _)) => {
            Some(tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("PROMETHEUS_ADDR {addr}: {e}"))?)
        }
    };
    let metrics_addr = match &metrics {
        Some(l) => Some(l.local_addr().map_err(|e| e.to_string())?),
        None => None,
    };
    Ok(Listeners { grpc, grpc_addr, http, http_addr, metrics, metrics_addr })
}

/// The task that keeps the configuration current: the files' reloader, or
/// the xDS client (without FORCE_START_WITHOUT_INITIAL_CONFIG, after its
/// first response, loaded or refused, as upstream waits for it).
async fn config_source(
    svc: &Arc<Service<RedisConn>>,
    files: Option<crate::runtime::Files>,
) -> Result<tokio::task::JoinHandle<()>, String> {
    match (files, svc.settings().xds.clone()) {
        (Some(files), _) => Ok(spawn_reloader(svc.clone(), files)),
        (None, Some(x)) => {
            let (first, got_first) = tokio::sync::oneshot::channel();
            let task = crate::xds::spawn(svc.clone(), x, Some(first));
            if !svc.settings().force_start {
                log!(crate::logger::Level::Info, "xDS: waiting for the first configuration");
                let _ = got_first.await;
            }
            Ok(task)
        }
        (None, None) => Err("no configuration source".into()),
    }
}

/// The health both checks answer, and the tasks that keep it current
/// (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, REDIS_HEALTH_CHECK_ACTIVE_CONNECTION).
async fn health(
    svc: &Arc<Service<RedisConn>>,
    probe: RedisConn,
) -> (
    Arc<Health>,
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let (reporter, health_svc) = tonic_health::server::health_reporter();
    let health = Arc::new(Health {
        redis_down: false.into(),
        stopping: false.into(),
        no_config: (svc.settings().healthy_with_config && !*svc.watch_domains().borrow()).into(),
        reporter,
        lock: tokio::sync::Mutex::new(()),
    });
    health.publish().await;
    let mut tasks = Vec::new();
    if svc.settings().healthy_with_config {
        let (h, mut rx) = (health.clone(), svc.watch_domains());
        tasks.push(tokio::spawn(async move {
            loop {
                let has = *rx.borrow_and_update();
                h.set_config(has).await;
                if rx.changed().await.is_err() {
                    break;
                }
            }
        }));
    }
    if svc.settings().redis_health_check {
        let (h, mut probe, t) = (health.clone(), probe, svc.settings().redis_timeout);
        tasks.push(tokio::spawn(async move {
            loop {
                let up =
                    matches!(tokio::time::timeout(t, redis::cmd("PING").query_async::<String>(&mut probe)).await, Ok(Ok(_)));
                h.set_redis(up).await;
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }));
    }
    (health, health_svc, tasks)
}

type Serving = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

async fn until_stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// The three listeners served until `stopped` (each drains what it has in
/// flight); the debug listener is [`crate::debug::serve`]'s.
fn serve(
    svc: &Arc<Service<RedisConn>>,
    l: Listeners,
    health: &Arc<Health>,
    health_svc: tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
    stopped: &tokio::sync::watch::Receiver<bool>,
) -> [Serving; 3] {
    let (age, grace) = svc.settings().grpc_max_connection_age;
    // the age alone: tonic's grace never sends GOAWAY; each connection is Aged instead
    let limit = age.checked_add(grace);
    let router = tonic::transport::Server::builder()
        .max_connection_age(age)
        .max_concurrent_streams(Some(MAX_CONCURRENT_STREAMS))
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_RESETS))
        .add_service(health_svc)
        .add_service(RateLimitServiceServer::new(Grpc(svc.clone())));
    let stop = until_stopped(stopped.clone());
    let grpc = match (l.grpc, svc.settings().grpc_tls.clone()) {
        (GrpcListener::Unix(l), _) => Box::pin(
            router.serve_with_incoming_shutdown(aged(tokio_stream::wrappers::UnixListenerStream::new(l), limit), stop),
        )
            as std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), tonic::transport::Error>> + Send>>,
        (GrpcListener::Tcp(l), Some(tls)) => {
            Box::pin(router.serve_with_incoming_shutdown(aged(crate::tls::incoming(l, &tls), limit), stop))
        }
        // TCP_NODELAY: tonic sets it only on listeners it binds itself; without
        // it Nagle holds a response behind an unacknowledged one (Envoy's delayed ACK)
        (GrpcListener::Tcp(l), None) => {
            Box::pin(router.serve_with_incoming_shutdown(aged(TcpIncoming::from(l).with_nodelay(Some(true)), limit), stop))
        }
    };
    let http_app = axum::Router::new()
        .merge(health_router(health.clone()))
        .merge(axum::Router::new().route("/json", post(json_handler::<RedisConn>)).with_state(svc.clone()));
    let http = axum::serve(l.http, http_app).with_graceful_shutdown(until_stopped(stopped.clone()));
    let (svc_m, stopped_m) = (svc.clone(), stopped.clone());
    let metrics_path = svc.settings().prometheus.as_ref().map(|p| p.1.clone()).unwrap_or_default();
    let metrics = async move {
        match l.metrics {
            Some(l) => {
                axum::serve(l, metrics_router(svc_m, &metrics_path)).with_graceful_shutdown(until_stopped(stopped_m)).await
            }
            None => {
                until_stopped(stopped_m).await;
                Ok(())
            }
        }
    };
    [
        Box::pin(async { grpc.await.map_err(|e| format!("gRPC server: {e}")) }),
        Box::pin(async { http.await.map_err(|e| format!("HTTP server: {e}")) }),
        Box::pin(async { metrics.await.map_err(|e| format!("Prometheus server: {e}")) }),
    ]
}

/// Connects to Redis, loads the configuration, binds both listeners and
/// starts serving (and reloading) in the background. Errors: Redis cannot
/// be reached, the first configuration does not load, a port cannot be bound.
pub async fn start(settings: Settings) -> Result<Running, String> {
    let (rl, probe) = rate_limiter(&settings).await?;
    let (cfg, files, first_refused) = first_config(&settings)?;
    let first_loaded = files.is_some() && first_refused.is_none();
    let listeners = bind(&settings).await?;
    let (grpc_addr, http_addr, metrics_addr) = (listeners.grpc_addr, listeners.http_addr, listeners.metrics_addr);
    let debug_listener = crate::debug::bind(&settings.debug_addr).await?;
    let debug_addr = debug_listener.local_addr().map_err(|e| e.to_string())?;
    // its exporting task outlives the listeners: it ends at Tracer::shutdown, having sent what is queued
    let tracer = settings.tracing.clone().map(|t| crate::trace::Tracer::start(t).0);
    let svc = Arc::new(Service::new(rl, cfg, settings).with_tracer(tracer));
    if !first_loaded {
        // no first configuration loaded: none counted (a refused one is an error)
        svc.metrics().config_load_success.store(0, std::sync::atomic::Ordering::Relaxed);
    }
    if let Some(e) = first_refused {
        svc.refuse_config(e);
    }
    let mut tasks = vec![config_source(&svc, files).await?];
    tasks.extend(crate::statsd::spawn(svc.clone()));
    let (health, health_svc, health_tasks) = health(&svc, probe).await;
    tasks.extend(health_tasks);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let debug = crate::debug::serve(svc.clone(), debug_listener, until_stopped(stopped.clone()));
    let [grpc, http, metrics] = serve(&svc, listeners, &health, health_svc, &stopped);
    let task = tokio::spawn(async move {
        let r = tokio::try_join!(grpc, http, metrics, debug);
        for t in tasks {
            t.abort();
        }
        r.map(|_| ())
    });
    Ok(Running { service: svc, grpc_addr, http_addr, metrics_addr, debug_addr, task, health, stop })
}

/// [`start`], then serves until SIGTERM: both health checks fail, the
/// requests in flight are answered (within [`SHUTDOWN_GRACE`]), and it
/// returns `Ok` (exit 0). SIGTERM while Redis is still awaited ends it at once.
pub async fn run(settings: Settings) -> Result<(), String> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("SIGTERM handler: {e}"))?;
    let r = tokio::select! {
        r = start(settings) => r?,
        _ = term.recv() => {
            log!(crate::logger::Level::Info, "SIGTERM before the service started: exiting");
            return Ok(());
        }
    };
    const W: crate::logger::Level = crate::logger::Level::Warn;
    match r.metrics_addr {
        Some(m) => log!(W, "listening: grpc {} http {} debug {} prometheus {m}", r.grpc_addr, r.http_addr, r.debug_addr),
        None => log!(W, "listening: grpc {} http {} debug {}", r.grpc_addr, r.http_addr, r.debug_addr),
    }
    let mut task = r.task;
    tokio::select! {
        done = &mut task => return done.map_err(|e| e.to_string())?,
        _ = term.recv() => {}
    }
    log!(crate::logger::Level::Info, "SIGTERM: health checks failing, answering the requests in flight");
    r.health.set_stopping().await;
    let _ = r.stop.send(true);
    let done = match tokio::time::timeout(SHUTDOWN_GRACE, &mut task).await {
        Ok(done) => done.map_err(|e| e.to_string())?,
        Err(_) => {
            log!(crate::logger::Level::Warn, "SIGTERM: requests still in flight after {SHUTDOWN_GRACE:?}; exiting");
            Ok(())
        }
    };
    // TRACING_ENABLED: the spans still queued, sent (within 5 s)
    if let Some(t) = r.service.tracer() {
        t.shutdown().await;
    }
    done
}
