//! The process's lifecycle, on the real binary (`redis-ratelimit-service`,
//! built here with cargo's quick profile unless `RL_SERVICE_BIN` names it):
//! started before Redis it waits for it (REDIS_STARTUP_*), SIGTERM during
//! load fails both health checks, answers every request in flight and
//! exits 0; the in-process health checks follow Redis with
//! REDIS_HEALTH_CHECK_ACTIVE_CONNECTION and answer for `ratelimit`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::support::*;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const CONFIG: &str =
    "domain: basic\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1000000\n";

/// The service binary: `RL_SERVICE_BIN`, or built once with cargo.
pub(crate) fn service_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(b) = std::env::var("RL_SERVICE_BIN") {
            return PathBuf::from(b);
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "--profile", "quick", "-q", "-p", "redis-ratelimit-service", "--bin", "redis-ratelimit-service"])
            .current_dir(&root)
            .status()
            .expect("run cargo build");
        assert!(st.success(), "cargo build of the service binary");
        let target = std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| root.join("target"));
        target.join("quick/redis-ratelimit-service")
    })
    .clone()
}

/// The binary on Redis at `rport`, its config in a temp dir, on free ports.
struct Svc {
    child: Child,
    dir: PathBuf,
    grpc: u16,
    http: u16,
}

impl Drop for Svc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The service binary on Redis at `rport`, its configuration under `dir`
/// (`rl/config/*.yaml`), gRPC and HTTP on `grpc` and `http` (0: any port),
/// the settings every test of a spawned service shares, then `extra`:
/// ready to spawn (stdout and stderr are the caller's).
pub(crate) fn service_command(dir: &Path, rport: u16, grpc: u16, http: u16, extra: &[(&str, &str)]) -> Command {
    let mut c = Command::new(service_bin());
    c.env_clear()
        .envs([
            ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
            ("REDIS_URL", format!("127.0.0.1:{rport}")),
            ("GRPC_HOST", "127.0.0.1".into()),
            ("GRPC_PORT", grpc.to_string()),
            ("HOST", "127.0.0.1".into()),
            ("PORT", http.to_string()),
            ("DEBUG_HOST", "127.0.0.1".into()),
            ("DEBUG_PORT", "0".into()),
            ("RUNTIME_ROOT", dir.to_string_lossy().into_owned()),
            ("RUNTIME_SUBDIRECTORY", "rl".into()),
            ("USE_STATSD", "false".into()),
        ])
        .envs(extra.iter().map(|(k, v)| (*k, *v)));
    c
}

impl Svc {
    fn start(name: &str, rport: u16, extra: &[(&str, &str)]) -> Svc {
        let dir = std::env::temp_dir().join(format!("rl-svc-life-{}-{name}-{}", std::process::id(), port()));
        let _ = std::fs::remove_dir_all(&dir);
        write(&dir.join("rl/config/config.yaml"), CONFIG);
        let (grpc, http) = (port(), port());
        let child = service_command(&dir, rport, grpc, http, extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the service binary");
        Svc { child, dir, grpc, http }
    }

    async fn client(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", self.grpc)).await.unwrap()
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }
}

fn redis_on(rport: u16) -> Proc {
    let p = Proc(spawn_redis(rport, &[]));
    wait_for("redis", Duration::from_secs(60), || redis_answers(rport));
    p
}

fn user(who: &str) -> RateLimitRequest {
    req("basic", vec![desc(&[("user", who)])])
}

async fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    out.get(9..12)?.parse().ok()
}

async fn grpc_health(port: u16, name: &str) -> Result<i32, tonic::Status> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    HealthClient::new(ch).check(HealthCheckRequest { service: name.into() }).await.map(|r| r.into_inner().status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_before_redis_it_waits_then_decides() {
    let rport = port();
    let mut svc = Svc::start(
        "late-redis",
        rport,
        &[("REDIS_STARTUP_INITIAL_INTERVAL", "200ms"), ("REDIS_STARTUP_MAX_INTERVAL", "1s")],
    );
    // Redis 5 s after the service (the service must still be waiting: a
    // service that gave up would have exited)
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        assert!(svc.exited().is_none(), "the service exited before Redis started: {:?}", svc.exited());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _redis = redis_on(rport);
    let mut got = None;
    let t1 = Instant::now();
    while got.is_none() && t1.elapsed() < Duration::from_secs(60) {
        assert!(svc.exited().is_none(), "the service exited: {:?}", svc.exited());
        if let Ok(mut c) = RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", svc.grpc)).await {
            got = c.should_rate_limit(user("late")).await.ok().map(|r| r.into_inner());
        }
        if got.is_none() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let got = got.expect("a decision within 60 s of Redis starting");
    assert_eq!(got.overall_code, OK);
    assert_eq!(http_status(svc.http, "/healthcheck").await, Some(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_startup_max_elapsed_time_gives_up() {
    let rport = port();
    let mut svc = Svc::start(
        "give-up",
        rport,
        &[("REDIS_STARTUP_INITIAL_INTERVAL", "50ms"), ("REDIS_STARTUP_MAX_ELAPSED_TIME", "300ms")],
    );
    let mut status = None;
    wait_for("the service to give up", Duration::from_secs(60), || {
        status = svc.exited();
        status.is_some()
    });
    assert_eq!(status.unwrap().code(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_load_answers_every_request_in_flight_and_exits_0() {
    let rport = port();
    let _redis = redis_on(rport);
    let mut svc = Svc::start("sigterm", rport, &[]);
    wait_for("the service", Duration::from_secs(60), || std::net::TcpStream::connect(("127.0.0.1", svc.grpc)).is_ok());
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut workers = Vec::new();
    for w in 0..8 {
        let (client, stop, ok, failed) = (svc.client().await, stop.clone(), ok.clone(), failed.clone());
        workers.push(tokio::spawn(async move {
            let mut c = client;
            let mut errors = Vec::new();
            // a request begun before the flag is raised may still reach the
            // wire after SIGTERM: once the server's GOAWAY closed the
            // connection, the channel connects again and is refused. That
            // request was never sent, so never in flight: it ends the worker.
            while !stop.load(Ordering::SeqCst) {
                match c.should_rate_limit(user(&format!("load{w}"))).await {
                    Ok(r) if r.get_ref().overall_code == OK => ok.fetch_add(1, Ordering::SeqCst),
                    Ok(r) => panic!("{r:?}"),
                    Err(e) if stop.load(Ordering::SeqCst) && e.to_string().contains("tcp connect error") => break,
                    Err(e) => {
                        errors.push(e.to_string());
                        failed.fetch_add(1, Ordering::SeqCst)
                    }
                };
            }
            errors
        }));
    }
    wait_for("load", Duration::from_secs(60), || ok.load(Ordering::SeqCst) >= 200);
    assert_eq!(grpc_health(svc.grpc, "ratelimit").await.unwrap(), ServingStatus::Serving as i32);
    stop.store(true, Ordering::SeqCst);
    sig(svc.child.id(), libc::SIGTERM);
    let mut errors = Vec::new();
    for w in workers {
        errors.extend(w.await.unwrap());
    }
    assert_eq!(failed.load(Ordering::SeqCst), 0, "requests in flight failed: {errors:?}");
    let mut status = None;
    // SHUTDOWN_GRACE is the service's promised bound; the rest is this machine's load
    wait_for("the exit", server::SHUTDOWN_GRACE + Duration::from_secs(30), || {
        status = svc.exited();
        status.is_some()
    });
    assert_eq!(status.unwrap().code(), Some(0), "exit status");
    println!("SIGTERM after {} decisions under load: 0 failed, exit 0", ok.load(Ordering::SeqCst));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_redis_and_stop() {
    let e = Env::start("health", CONFIG, &[("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true")]).await;
    for name in ["", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"] {
        assert_eq!(grpc_health(e.grpc, name).await.unwrap(), ServingStatus::Serving as i32, "{name:?}");
    }
    assert_eq!(http_status(e.http, "/healthcheck").await, Some(200));
    // Redis stopped (SIGSTOP: no answer): both checks fail, then recover
    let pid = e.redis.as_ref().unwrap().0.id();
    sig(pid, libc::SIGSTOP);
    let mut seen = None;
    for _ in 0..600 {
        let h = http_status(e.http, "/healthcheck").await;
        let g = grpc_health(e.grpc, "ratelimit").await.ok();
        if h == Some(500) && g == Some(ServingStatus::NotServing as i32) {
            seen = Some(());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sig(pid, libc::SIGCONT);
    assert!(seen.is_some(), "the health checks never failed with Redis stopped");
    let mut back = false;
    for _ in 0..600 {
        if http_status(e.http, "/healthcheck").await == Some(200) {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(back, "not healthy again after Redis came back");
    // what SIGTERM does first (the binary's test sends the signal itself)
    e.svc.health.set_stopping().await;
    assert_eq!(http_status(e.http, "/healthcheck").await, Some(500));
    assert_eq!(grpc_health(e.grpc, "ratelimit").await.unwrap(), ServingStatus::NotServing as i32);
}
