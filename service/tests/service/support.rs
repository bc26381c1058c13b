//! What every topic of the suite shares: a server with the module and the
//! service on it (`Env`), the request builders, the clock's windows, and
//! the stall tests' bound.

pub use std::collections::HashMap;
pub use std::path::{Path, PathBuf};
pub use std::process::{Child, Command, Stdio};
pub use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{Entry, RateLimitOverride};
pub use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
pub use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
pub use envoy_types::pb::google::protobuf::UInt64Value;
pub use redis_ratelimit_service::server;
pub use redis_ratelimit_service::settings::Settings;
pub use rl_test_support as common;
pub use serde_json::{json, Value};
pub use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const OK: i32 = 1;
pub const OVER: i32 = 2;

/// A free port, and the module's path: the shared harness's.
pub use rl_test_support::free_port as port;

/// A process killed when dropped.
pub struct Proc(pub Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether a Redis answers PONG on `port`. A bare TCP connect is not
/// enough: while nothing listens on a port of the ephemeral range, a
/// connect to it can pick that same port as its source and connect to
/// itself (Linux's TCP self-connect), which once made a test believe its
/// server was up (and kept the server from binding the port): the service
/// then met "connection reset by peer". A self-connected socket reads back
/// its own PING, never +PONG.
pub fn redis_answers(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// REDIS_SERVER on `rport`, with the module unless RL_MODULE=none, no
/// persistence, `server_args` after: spawned.
pub fn spawn_redis(rport: u16, server_args: &[&str]) -> Child {
    Command::new(std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()))
        .args(["--port", &rport.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(common::module_args())
        .args(server_args)
        .current_dir(std::env::temp_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start REDIS_SERVER")
}

/// [`spawn_redis`] on a free port, once it answers.
pub fn plain_redis(server_args: &[&str]) -> (Proc, u16) {
    start_redis(|rport| spawn_redis(rport, server_args))
}

/// Starts a server with `start(port)` on a free port until it answers
/// PONG: a server that exits first (its port taken meanwhile, as by a
/// self-connect) is started again on another port, three times at most.
pub fn start_redis(mut start: impl FnMut(u16) -> Child) -> (Proc, u16) {
    for _ in 0..3 {
        let rport = port();
        let mut p = Proc(start(rport));
        let t0 = Instant::now();
        loop {
            if redis_answers(rport) {
                return (p, rport);
            }
            if p.0.try_wait().ok().flatten().is_some() {
                break; // exited: another port
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "timed out waiting for redis on {rport}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    panic!("redis exited at start three times (REDIS_SERVER, RL_MODULE?)")
}

pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A redis-server (or valkey-server) with the module, and the service on it.
pub struct Env {
    pub dir: PathBuf,
    pub grpc: u16,
    pub http: u16,
    pub svc: server::Running,
    pub redis_port: u16,
    pub redis: Option<Proc>,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.svc.task.abort();
        // the server is killed right after (its field); it keeps no files
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    // write then rename: the reloader never sees half a file
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

impl Env {
    pub async fn start(name: &str, config: &str, extra_env: &[(&str, &str)]) -> Env {
        Env::start_with(name, config, extra_env, &[]).await
    }

    /// [`Env::start`] with more arguments for the server.
    pub async fn start_with(name: &str, config: &str, extra_env: &[(&str, &str)], server_args: &[&str]) -> Env {
        let (redis, rport) = plain_redis(server_args);
        Env::serve(name, &[config], extra_env, rport, Some(redis)).await
    }

    /// The service (one file per configuration) on Redis as `extra_env`
    /// says (REDIS_URL defaults to 127.0.0.1:`rport`).
    pub async fn serve(name: &str, configs: &[&str], extra_env: &[(&str, &str)], rport: u16, redis: Option<Proc>) -> Env {
        Env::try_serve(name, configs, extra_env, rport, redis).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Env::serve`], or the error of the settings or of the start (what
    /// the binary prints before it exits 2 or 1).
    pub async fn try_serve(
        name: &str,
        configs: &[&str],
        extra_env: &[(&str, &str)],
        rport: u16,
        redis: Option<Proc>,
    ) -> Result<Env, String> {
        let dir = std::env::temp_dir().join(format!("rl-svc-{}-{name}-{}", std::process::id(), port()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // RUNTIME_ROOT is a symlink to a versioned directory, as deployments swap it
        for (i, config) in configs.iter().enumerate() {
            let file = if i == 0 { "config.yaml".to_owned() } else { format!("config{i}.yaml") };
            write(&dir.join("v1/ratelimit/config").join(file), config);
        }
        std::os::unix::fs::symlink(dir.join("v1"), dir.join("current")).unwrap();
        let mut vars: HashMap<String, String> = [
            ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
            ("REDIS_URL", format!("127.0.0.1:{rport}")),
            ("REDIS_TIMEOUT", "2s".to_owned()),
            // one attempt: a test of a refused start gets its error at once
            ("REDIS_STARTUP_MAX_ELAPSED_TIME", "1ns".to_owned()),
            ("GRPC_HOST", "127.0.0.1".to_owned()),
            ("GRPC_PORT", "0".to_owned()),
            ("HOST", "127.0.0.1".to_owned()),
            ("PORT", "0".to_owned()),
            // envoyproxy/ratelimit's default is 0.0.0.0:6070, which tests alongside would share
            ("DEBUG_HOST", "127.0.0.1".to_owned()),
            ("DEBUG_PORT", "0".to_owned()),
            ("RUNTIME_ROOT", dir.join("current").to_string_lossy().into_owned()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
            ("RUNTIME_APPDIRECTORY", "config".to_owned()),
            ("RUNTIME_POLL_INTERVAL", "20ms".to_owned()),
            // envoyproxy/ratelimit's default is true (statsd on localhost:8125);
            // the tests of the statsd sink set it and their own listener
            ("USE_STATSD", "false".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        for (k, v) in extra_env {
            vars.insert((*k).to_owned(), (*v).to_owned());
        }
        let started = match Settings::from_map(&vars) {
            Ok(settings) => server::start(settings).await,
            Err(e) => Err(format!("settings: {e}")),
        };
        let svc = started.inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&dir);
        })?;
        let (grpc, http) = (svc.grpc_addr.port(), svc.http_addr.port());
        Ok(Env { dir, grpc, http, svc, redis_port: rport, redis })
    }

    /// A direct connection to the server (to look at the keys the service wrote).
    pub fn redis(&self) -> redis::Connection {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.redis_port)).unwrap().get_connection().unwrap()
    }

    pub fn refusal(&self) -> Option<String> {
        self.svc.service.last_refusal()
    }

    pub async fn client(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", self.grpc)).await.unwrap()
    }

    pub async fn ask(&self, req: RateLimitRequest) -> RateLimitResponse {
        self.client().await.should_rate_limit(req).await.unwrap().into_inner()
    }

    /// An HTTP/1.1 request on a fresh connection: (status, body).
    pub async fn http(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.http)).await.unwrap();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let status = out[9..12].parse().unwrap();
        let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
        (status, body)
    }

    pub async fn json(&self, req: Value) -> (u16, Value) {
        let (st, body) = self.http("POST", "/json", &req.to_string()).await;
        (st, serde_json::from_str(&body).unwrap_or(Value::String(body)))
    }
}

pub fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| Entry { key: (*k).into(), value: (*v).into() }).collect(),
        ..RateLimitDescriptor::default()
    }
}

pub fn req(domain: &str, ds: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest { domain: domain.into(), descriptors: ds, hits_addend: 0 }
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Waits (polling the clock) until at least `margin_ms` remain in the
/// current window of `window_ms`, so that a few calls share one window.
pub fn fresh_window(window_ms: u64, margin_ms: u64) {
    wait_for("a fresh window", Duration::from_millis(window_ms + 100), || window_ms - now_ms() % window_ms >= margin_ms);
}

// ---- Time-safety ----------------------------------------------------------
//
// The service's default algorithm is a fixed window aligned to the epoch on
// the server's clock: a test that counts N calls in one window fails if a
// boundary passes between them. No test here depends on where the clock
// falls or on how long its run takes: each scenario whose counts must
// share a window is run again, on fresh keys or fresh servers, when a
// boundary of that window passed while it ran (the servers run on this
// host: their TIME is this clock, `now_ms`). A run during which no
// boundary passed is judged by every assertion, so none is weakened; a
// second run starts just after the boundary, a whole window from the next.

/// An hour: the window of most tests' limits (`unit: hour`).
pub const HOUR_MS: u64 = 3_600_000;

/// Runs a test's whole scenario, `body` (which starts its own servers and
/// service), so that a boundary of the epoch-aligned window of `window_ms`
/// cannot fail it: a run that fails while a boundary passed is run again on
/// fresh servers (at most 3 runs); a run that fails within one window
/// fails the test with its own panic. The scenario runs on the test's
/// thread, as the test's body did (not on a worker of the runtime: its
/// blocking polls would hold the tasks queued on that worker).
pub async fn in_one_window<F, Fut>(window_ms: u64, body: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for run in 1.. {
        let w0 = now_ms() / window_ms;
        let result = CatchUnwind(Box::pin(body())).await;
        let crossed = now_ms() / window_ms != w0;
        match result {
            Ok(()) => return,
            Err(_) if crossed && run < 3 => println!("a {window_ms} ms window ended during run {run}: run again"),
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}

/// A future's panic as an `Err` (the future is dropped with it).
struct CatchUnwind<F>(std::pin::Pin<Box<F>>);

impl<F: std::future::Future> std::future::Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let inner = self.0.as_mut();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Ok(std::task::Poll::Ready(v)) => std::task::Poll::Ready(Ok(v)),
            Err(p) => std::task::Poll::Ready(Err(p)),
        }
    }
}

/// [`in_one_window`] for a test that runs its own runtimes.
pub fn in_one_window_sync(window_ms: u64, body: impl Fn()) {
    for run in 1.. {
        let w0 = now_ms() / window_ms;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&body));
        let crossed = now_ms() / window_ms != w0;
        match result {
            Ok(()) => return,
            Err(_) if crossed && run < 3 => println!("a {window_ms} ms window ended during run {run}: run again"),
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}

/// Calls that must share one window of `window_ms`: `burst(attempt)` makes
/// them on keys of its own for each attempt and returns what it saw, which
/// the caller then asserts. Each attempt starts with at least `margin_ms`
/// left in the window; an attempt during which a boundary passed is made
/// again (on new keys), up to 20 attempts.
pub async fn burst_in_one_window<T, F, Fut>(window_ms: u64, margin_ms: u64, mut burst: F) -> T
where
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    for attempt in 0..20 {
        fresh_window(window_ms, margin_ms);
        let w0 = now_ms() / window_ms;
        let seen = burst(attempt).await;
        if now_ms() / window_ms == w0 {
            return seen;
        }
        println!("a {window_ms} ms window ended during attempt {attempt}: again, on new keys");
    }
    panic!("no attempt of 20 fitted in one window of {window_ms} ms");
}

pub fn rem(s: &DescriptorStatus) -> (i32, u32) {
    (s.code, s.limit_remaining)
}

pub const CONFIG: &str = r#"
domain: basic
descriptors:
  - key: per_second
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: per_minute
    rate_limit: {unit: minute, requests_per_unit: 5, name: minute_five}
  - key: site
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 10, name: tenant_base}
  - key: vip
    rate_limit: {unit: hour, requests_per_unit: 1000, name: vip, replaces: [{name: tenant_base}]}
"#;

// ---- Redis down, Redis Cluster, Sentinel -------------------------------

/// REDIS_TIMEOUT of the stall tests, and the slack the bound allows on top
/// of it (the gRPC round trip and scheduling on a loaded 2-core machine):
/// every answer while Redis is stopped comes within their sum.
pub const STALL_TIMEOUT_MS: u64 = 250;
pub const SLACK_MS: u64 = 250;

pub fn stall_env() -> [(&'static str, &'static str); 1] {
    [("REDIS_TIMEOUT", "250ms")]
}

pub fn sig(pid: u32, sig: i32) {
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

/// The sentinel and cluster tests start several servers: `make
/// test-service` runs them on one server line only (RL_SERVICE_TOPOLOGY=0
/// on the others); by default they run.
pub fn topology() -> bool {
    let on = std::env::var("RL_SERVICE_TOPOLOGY").map_or(true, |v| v != "0");
    if !on {
        println!("skipped: RL_SERVICE_TOPOLOGY=0 (run on another server line)");
    }
    on
}

pub type Grpc = RateLimitServiceClient<tonic::transport::Channel>;

/// One gRPC call, timed.
pub async fn timed(c: &mut Grpc, r: RateLimitRequest) -> (Result<RateLimitResponse, tonic::Status>, Duration) {
    let t = Instant::now();
    let a = c.should_rate_limit(r).await.map(|a| a.into_inner());
    (a, t.elapsed())
}

pub fn within_bound(took: Duration, what: &str) {
    assert!(took <= Duration::from_millis(STALL_TIMEOUT_MS + SLACK_MS), "{what}: answered after {took:?}");
}

/// The decisions' calls Redis has served and their µs inside the commands
/// (`INFO commandstats`): the module's `RL.*`, or without it
/// (`RL_MODULE=none`) the Lua twins' `EVALSHA`, `EVAL` and `FCALL`; calls
/// that answered an error (`failed_calls`: a first `EVALSHA`'s `NOSCRIPT`)
/// are not decisions.
pub fn decision_calls(r: &mut redis::Connection) -> (u64, u64) {
    let info: String = redis::cmd("INFO").arg("commandstats").query(r).unwrap();
    let field = |l: &str, f: &str| l.split(f).nth(1)?.split(',').next()?.parse::<u64>().ok();
    let mut out = (0, 0);
    for l in info.lines() {
        let l = l.to_ascii_lowercase();
        let ours = l.starts_with("cmdstat_rl.")
            || ["cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_fcall:"].iter().any(|p| l.starts_with(p));
        if ours {
            out.0 += field(&l, "calls=").unwrap_or(0).saturating_sub(field(&l, "failed_calls=").unwrap_or(0));
            out.1 += field(&l, ",usec=").unwrap_or(0);
        }
    }
    out
}
