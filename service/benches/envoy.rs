//! `make bench-envoy`: the Envoy rate-limit service under load, and Redis's
//! work per decision against envoyproxy/ratelimit's workload (issue 32,
//! part 6). Written here; envoyproxy/ratelimit's `src/redis/fixed_cache_impl.go`
//! was read for what it sends to Redis.
//!
//! One run, five phases, on one Redis with the module (pinned to core 0 with
//! `taskset -c 0`) and the release service binary (pinned to core 1):
//!
//! 1. **max**: decisions per second of the service, closed loop (`--inflight`
//!    requests in flight over `--conns` HTTP/2 connections), at 1, 2 and 4
//!    descriptors per request; and the service's own CPU time per decision
//!    (`/proc/PID/task/*/schedstat`), so decisions per core-second even when
//!    the load generator, not the service, is the bottleneck.
//! 2. **latency**: p50/p99/p99.9 at a fixed offered load of half each max,
//!    open loop: request i is due at t0 + i/rate, sent by a pacing thread at
//!    its due time, and its latency is counted from the due time (a late send
//!    counts against the service: coordinated omission cannot hide latency).
//! 3. **redis**: Redis server time per decision, the service's `RL.MULTI`
//!    against envoyproxy/ratelimit's workload replayed here from the same
//!    requests straight to Redis: per descriptor `INCRBY key hits` + `EXPIRE
//!    key unit` in one pipeline (keys carry the window start, as there), and
//!    the `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` mode (a `GET` pipeline
//!    first, then the `INCRBY` + `EXPIRE` pipeline). Each cell sends the same
//!    number of decisions at the same open-loop rate; measured: the
//!    redis-server process's CPU time (schedstat, ns: parsing, dispatch,
//!    replies and syscalls, everything the server does for a decision), its
//!    `INFO commandstats` usec (time inside the commands only) and
//!    `total_reads_processed` (reads per decision: batching). Rounds are
//!    interleaved; the median round is reported.
//! 4. **over-admission**: many concurrent clients, one user over its limit
//!    and a site-wide limit in every request: grants per key against each
//!    limit, and what the site counter took, for the service and both
//!    replayed models.
//! 5. **callgrind**: the three workloads of 3 against a second redis-server
//!    under callgrind (and a second service on it): the server's
//!    instructions per decision, one decision at a time. Deterministic where
//!    CPU time on a shared 2-core machine is not; kernel work not counted.
//!
//! `--count-only N` runs none of these but the service under callgrind: its
//! instructions and heap allocations per decision (see `count_only`).
//!
//! Arguments (`--name value`; `make bench-envoy ARGS="..."`): see `usage()`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const OK: i32 = 1;

/// The first failed request of a run is printed (the counts are in the table).
static FIRST_ERROR: AtomicBool = AtomicBool::new(true);

type Client = RateLimitServiceClient<Channel>;
type Conn = redis::aio::MultiplexedConnection;

fn usage() -> &'static str {
    "bench-envoy [--quick] [--server PATH] [--module PATH] [--service PATH] [--write BENCHMARKS.md]
  --max-secs S      each max cell's measured window (default 4; quick 1)
  --lat-secs S      each latency cell (default 4; quick 1)
  --conns N         HTTP/2 connections to the service (default 4)
  --inflight N      requests in flight in the max cells (default 64)
  --keys N          descriptor values per descriptor key (default 1000)
  --lat-rate R      the first offered load of the latency cells (default 10000,
                    half the 20,000/s target; 0: none); the second is half
                    each max
  --lat-rounds N    interleaved rounds at the first load (default 3; quick 1)
  --fifo            the load generator and Redis at SCHED_FIFO in the cells
                    at the first load, then those cells again at normal
                    priority (default: normal priority throughout)
  --redis-rate R    offered load of the Redis cells, decisions/s (default 5000;
                    0: half the service's max at each descriptor count)
  --redis-n N       decisions per Redis cell (default 10000; quick 2000)
  --rounds N        interleaved rounds of the Redis cells (default 3; quick 1)
  --pool N          replay connections to Redis, REDIS_POOL_SIZE (default 10)
  --oa-clients N    concurrent clients of the over-admission phase (default 64)
  --oa-requests N   requests of the over-admission phase (default 4000)
  --cg-n N          decisions per callgrind cell (default 1000; quick 200; 0: none)
  --write PATH      replace the bench-envoy section of PATH (BENCHMARKS.md)
  --note TEXT       a note for the section (e.g. which profile, its build time)
  --count-only N    only this: the service under callgrind (Redis as usual),
                    N decisions at 1, 2 and 4 descriptors, one at a time, and
                    its instructions and allocations (malloc, calloc, realloc,
                    posix_memalign calls) per decision, whole process"
}

#[derive(Clone)]
struct Args {
    quick: bool,
    server: String,
    module: String,
    service: String,
    max_secs: f64,
    lat_secs: f64,
    conns: usize,
    inflight: usize,
    keys: u64,
    redis_rate: f64,
    lat_rate: f64,
    lat_rounds: usize,
    fifo: bool,
    redis_n: u64,
    rounds: usize,
    pool: usize,
    oa_clients: usize,
    oa_requests: usize,
    cg_n: u64,
    count_only: u64,
    write: Option<PathBuf>,
    note: String,
}

fn parse_args() -> Args {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut kv: HashMap<String, String> = HashMap::new();
    let mut quick = false;
    let mut fifo = false;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--bench" => {} // cargo bench passes it
            "--quick" => quick = true,
            "--fifo" => fifo = true,
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            s if s.starts_with("--") => {
                let v = it.next().unwrap_or_else(|| panic!("{s} needs a value\n{}", usage()));
                kv.insert(s[2..].to_owned(), v);
            }
            s => panic!("unknown argument {s}\n{}", usage()),
        }
    }
    let num = |k: &str, d: f64| kv.get(k).map(|v| v.parse::<f64>().unwrap_or_else(|_| panic!("--{k} {v}"))).unwrap_or(d);
    let q = |normal: f64, short: f64| if quick { short } else { normal };
    Args {
        quick,
        server: kv
            .get("server")
            .cloned()
            .or_else(|| std::env::var("REDIS_SERVER").ok())
            .unwrap_or_else(|| "redis-server".into()),
        module: kv
            .get("module")
            .cloned()
            .or_else(|| std::env::var("RL_MODULE").ok())
            .unwrap_or_else(|| root.join("target/release/libredis_ratelimit.so").to_string_lossy().into_owned()),
        service: kv
            .get("service")
            .cloned()
            .unwrap_or_else(|| root.join("target/release/redis-ratelimit-service").to_string_lossy().into_owned()),
        max_secs: num("max-secs", q(4.0, 1.0)),
        lat_secs: num("lat-secs", q(4.0, 1.0)),
        conns: num("conns", 4.0) as usize,
        inflight: num("inflight", 64.0) as usize,
        keys: num("keys", 1000.0) as u64,
        redis_rate: num("redis-rate", 5000.0),
        lat_rate: num("lat-rate", 10000.0),
        lat_rounds: num("lat-rounds", q(3.0, 1.0)) as usize,
        fifo,

        redis_n: num("redis-n", q(10000.0, 2000.0)) as u64,
        rounds: num("rounds", q(3.0, 1.0)) as usize,
        pool: num("pool", 10.0) as usize,
        oa_clients: num("oa-clients", 64.0) as usize,
        oa_requests: num("oa-requests", q(4000.0, 1000.0)) as usize,
        cg_n: num("cg-n", q(1000.0, 200.0)) as u64,
        count_only: num("count-only", 0.0) as u64,
        write: kv.get("write").map(PathBuf::from),
        note: kv.get("note").cloned().unwrap_or_default(),
    }
}

// -- processes ---------------------------------------------------------------

/// A child process killed when dropped.
struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
impl Proc {
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn wait_port(port: u16, what: &str, child: &mut Proc) {
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(st)) = child.0.try_wait() {
            panic!("{what} exited: {st}");
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "{what} did not listen on {port}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// CPU time of every thread of `pid`, ns (`/proc/PID/task/*/schedstat`:
/// time on a CPU, user and system, at scheduler resolution).
fn cpu_ns(pid: u32) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in rd.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                total += s.split_whitespace().next().and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
            }
        }
    }
    total
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn uptime() -> String {
    Command::new("uptime").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default()
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// 2026-12-03 21:40 UTC, from the epoch (no date crate).
fn utc(t: u64) -> String {
    let days = (t / 86400) as i64;
    let (h, m) = ((t % 86400) / 3600, (t % 3600) / 60);
    // civil from days (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y}-{mo:02}-{d:02} {h:02}:{m:02} UTC")
}

// -- the workload --------------------------------------------------------------

/// The value of descriptor `i` of request `j` (one of `keys`), the same for
/// the service and the replay.
fn value(j: u64, i: usize, keys: u64) -> u64 {
    let mut x = j.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((i as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    x ^= x >> 31;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 29;
    x % keys
}

/// The bench domain: descriptor keys k0..k3, each limited per hour far
/// above what a run sends (every decision is granted).
const BENCH_LIMIT: u64 = 4_000_000_000;
const BENCH_UNIT_S: u64 = 3600;
/// The over-admission domain: a user limit and a site-wide limit per day.
const OA_USER_LIMIT: u64 = 100;
const OA_SITE_LIMIT: u64 = 1000;
const OA_UNIT_S: u64 = 86400;

/// The two configuration files: the bench domain and the over-admission domain.
fn config_yaml() -> [(&'static str, String); 2] {
    let mut s = String::from("domain: bench\ndescriptors:\n");
    for i in 0..4 {
        s += &format!("  - key: k{i}\n    rate_limit: {{unit: hour, requests_per_unit: {BENCH_LIMIT}}}\n");
    }
    let oa = format!(
        "domain: oa\ndescriptors:\n  - key: user\n    rate_limit: {{unit: day, requests_per_unit: {OA_USER_LIMIT}}}\n  \
         - key: site\n    rate_limit: {{unit: day, requests_per_unit: {OA_SITE_LIMIT}}}\n"
    );
    [("bench.yaml", s), ("oa.yaml", oa)]
}

fn bench_request(j: u64, n: usize, keys: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: (0..n)
            .map(|i| RateLimitDescriptor {
                entries: vec![Entry { key: format!("k{i}"), value: format!("v{}", value(j, i, keys)) }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// envoyproxy/ratelimit's key: prefix + domain + "_" + (key + "_" + value + "_")* + window start.
fn envoy_key(prefix: &str, domain: &str, entries: &[(String, String)], unit_s: u64, now: u64) -> String {
    let mut k = format!("{prefix}{domain}_");
    for (key, v) in entries {
        k += key;
        k.push('_');
        k += v;
        k.push('_');
    }
    k += &(now / unit_s * unit_s).to_string();
    k
}

fn bench_entries(j: u64, n: usize, keys: u64) -> Vec<(String, String)> {
    (0..n).map(|i| (format!("k{i}"), format!("v{}", value(j, i, keys)))).collect()
}

/// One decision of envoyproxy/ratelimit's fixed-window cache on Redis:
/// `INCRBY` + `EXPIRE` per descriptor in one pipeline; with `get_first`
/// (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`) a `GET` pipeline first, and
/// when a key would pass its limit, only the keys that would are
/// incremented (the others `INCRBY 0`), as its `getHitsAddend` does.
/// Returns the counts after the increment (its `limitAfterIncrease`).
async fn envoy_decide(con: &mut Conn, keys: &[String], limits: &[u64], unit_s: u64, get_first: bool) -> Vec<u64> {
    let n = keys.len();
    let mut hits = vec![1u64; n];
    if get_first {
        let mut p = redis::pipe();
        for k in keys {
            p.cmd("GET").arg(k);
        }
        let before: Vec<Option<u64>> = p.query_async(con).await.expect("GET pipeline");
        let over: Vec<bool> = (0..n).map(|i| before[i].unwrap_or(0) + 1 > limits[i]).collect();
        if over.iter().any(|&o| o) {
            for i in 0..n {
                hits[i] = u64::from(over[i]);
            }
        }
    }
    let mut p = redis::pipe();
    for (k, h) in keys.iter().zip(&hits) {
        p.cmd("INCRBY").arg(k).arg(*h);
        p.cmd("EXPIRE").arg(k).arg(unit_s).ignore();
    }
    p.query_async(con).await.expect("INCRBY pipeline")
}

/// A pool of Redis connections, each used by one request at a time (as
/// envoyproxy/ratelimit's radix pool of `REDIS_POOL_SIZE`).
struct Pool {
    free: tokio::sync::Mutex<Vec<Conn>>,
    sem: tokio::sync::Semaphore,
}

impl Pool {
    async fn new(url: &str, size: usize) -> Arc<Pool> {
        let client = redis::Client::open(url).unwrap();
        let mut v = Vec::new();
        for _ in 0..size {
            v.push(client.get_multiplexed_async_connection().await.unwrap());
        }
        Arc::new(Pool { free: tokio::sync::Mutex::new(v), sem: tokio::sync::Semaphore::new(size) })
    }
    async fn get(&self) -> (tokio::sync::SemaphorePermit<'_>, Conn) {
        let permit = self.sem.acquire().await.unwrap();
        let c = self.free.lock().await.pop().unwrap();
        (permit, c)
    }
    async fn put(&self, c: Conn) {
        self.free.lock().await.push(c);
    }
}

// -- load ----------------------------------------------------------------------

/// The HTTP/2 connections to the service, and a rate-limit client on each.
struct Clients(Vec<Client>, Vec<Channel>);
impl Clients {
    fn get(&self, j: u64) -> Client {
        self.0[(j % self.0.len() as u64) as usize].clone()
    }
    /// A gRPC health client on the same connection as [`Clients::get`]`(j)`.
    fn health(&self, j: u64) -> HealthClient<Channel> {
        HealthClient::new(self.1[(j % self.1.len() as u64) as usize].clone())
    }
}

struct MaxCell {
    n: usize,
    rate: f64,
    svc_cpu_ns_per_dec: f64,
    svc_util: f64,
    errors: u64,
}

/// Closed loop: `inflight` tasks each sending one request after the other;
/// counted over `secs` after a warm-up.
async fn max_cell(cl: &Arc<Clients>, svc_pid: u32, n: usize, a: &Args) -> MaxCell {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let seq = Arc::new(AtomicU64::new(n as u64 * 10_000_000));
    let mut tasks = Vec::new();
    for _ in 0..a.inflight {
        let (cl, stop, done, errors, seq, keys) =
            (cl.clone(), stop.clone(), done.clone(), errors.clone(), seq.clone(), a.keys);
        tasks.push(tokio::spawn(async move {
            while !stop.load(Relaxed) {
                let j = seq.fetch_add(1, Relaxed);
                match cl.get(j).should_rate_limit(bench_request(j, n, keys)).await {
                    Ok(r) if r.get_ref().overall_code == OK => {}
                    _ => {
                        errors.fetch_add(1, Relaxed);
                    }
                }
                done.fetch_add(1, Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(if a.quick { 0.3 } else { 1.0 })).await;
    let (d0, c0, t0) = (done.load(Relaxed), cpu_ns(svc_pid), Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(a.max_secs)).await;
    let (d1, c1, el) = (done.load(Relaxed), cpu_ns(svc_pid), t0.elapsed().as_secs_f64());
    stop.store(true, Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let dec = (d1 - d0).max(1) as f64;
    MaxCell {
        n,
        rate: dec / el,
        svc_cpu_ns_per_dec: (c1 - c0) as f64 / dec,
        svc_util: (c1 - c0) as f64 / 1e9 / el,
        errors: errors.load(Relaxed),
    }
}

/// Open loop at `rate`: request i is due at t0 + i/rate; a pacing thread
/// starts each at its due time (or at once when late). `f(i, due)` is the
/// request; it returns the latency from `due` in ns (or u64::MAX on error).
/// Returns the latencies and the pacer's lateness (ns) per request.
async fn open_loop<F, Fut>(rate: f64, count: u64, f: F) -> (Vec<u64>, Vec<u64>)
where
    F: Fn(u64, Instant) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = u64> + Send + 'static,
{
    let lat: Arc<Vec<AtomicU64>> = Arc::new((0..count).map(|_| AtomicU64::new(u64::MAX)).collect());
    let late: Arc<Vec<AtomicU64>> = Arc::new((0..count).map(|_| AtomicU64::new(0)).collect());
    let pending = Arc::new(AtomicU64::new(count));
    let notify = Arc::new(tokio::sync::Notify::new());
    let handle = tokio::runtime::Handle::current();
    let f = Arc::new(f);
    let (lat2, late2, pending2, notify2) = (lat.clone(), late.clone(), pending.clone(), notify.clone());
    let pacer = std::thread::spawn(move || {
        let t0 = Instant::now() + Duration::from_millis(5);
        for i in 0..count {
            let due = t0 + Duration::from_secs_f64(i as f64 / rate);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            late2[i as usize].store(Instant::now().saturating_duration_since(due).as_nanos() as u64, Relaxed);
            let (f, lat, pending, notify) = (f.clone(), lat2.clone(), pending2.clone(), notify2.clone());
            handle.spawn(async move {
                let ns = f(i, due).await;
                lat[i as usize].store(ns, Relaxed);
                if pending.fetch_sub(1, Relaxed) == 1 {
                    notify.notify_one();
                }
            });
        }
    });
    while pending.load(Relaxed) > 0 {
        let _ = tokio::time::timeout(Duration::from_millis(50), notify.notified()).await;
    }
    pacer.join().unwrap();
    let lat = lat.iter().map(|x| x.load(Relaxed)).collect();
    let late = late.iter().map(|x| x.load(Relaxed)).collect();
    (lat, late)
}

/// A wake-up probe's figures in words.
fn probe_text((n, over1, over2, max): (u64, u64, u64, u64)) -> String {
    format!("{} of {} wake-ups late by over 1 ms, {} by over 2 ms, the latest by {} ms", over1, f0(n as f64), over2, ms(max))
}

/// A latency row's first cell: the control or the descriptor count, and `tail`.
fn lat_label(n: usize, tail: &str) -> String {
    if n == 0 {
        format!("control: health check{tail}")
    } else {
        format!("{n}{tail}")
    }
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1]
}

struct LatCell {
    n: usize,
    rate: f64,
    achieved: f64,
    p50: u64,
    p99: u64,
    p999: u64,
    max: u64,
    late_p99: u64,
    errors: usize,
    /// the service's and the load generator's CPU use during the cell (1.0 = one core)
    svc_busy: f64,
    gen_busy: f64,
}

async fn lat_cell(cl: &Arc<Clients>, svc_pid: u32, n: usize, rate: f64, a: &Args) -> LatCell {
    let count = (rate * a.lat_secs).max(100.0) as u64;
    let keys = a.keys;
    let base = 20_000_000 * n as u64;
    let cl2 = cl.clone();
    let (s0, g0) = (cpu_ns(svc_pid), cpu_ns(std::process::id()));
    let t0 = Instant::now();
    let (lat, late) = open_loop(rate, count, move |i, due| {
        let (mut c, mut h) = (cl2.get(i), cl2.health(i));
        async move {
            let r = if n == 0 {
                // the control: the gRPC health check, on the same connections
                // and load, through the same server, without Redis
                h.check(HealthCheckRequest { service: String::new() }).await.map(|_| ()).map_err(|e| format!("{e:?}"))
            } else {
                match c.should_rate_limit(bench_request(base + i, n, keys)).await {
                    Ok(r) if r.get_ref().overall_code == OK => Ok(()),
                    r => Err(format!("{r:?}")),
                }
            };
            match r {
                Ok(()) => due.elapsed().as_nanos() as u64,
                Err(e) => {
                    if FIRST_ERROR.swap(false, Relaxed) {
                        eprintln!("  first error of a latency cell: {e}");
                    }
                    u64::MAX
                }
            }
        }
    })
    .await;
    let el = t0.elapsed().as_secs_f64();
    let (svc_busy, gen_busy) =
        ((cpu_ns(svc_pid) - s0) as f64 / 1e9 / el, (cpu_ns(std::process::id()) - g0) as f64 / 1e9 / el);
    let errors = lat.iter().filter(|&&x| x == u64::MAX).count();
    let mut ok: Vec<u64> = lat.into_iter().filter(|&x| x != u64::MAX).collect();
    ok.sort_unstable();
    let mut late = late;
    late.sort_unstable();
    LatCell {
        n,
        rate,
        achieved: count as f64 / el,
        p50: pct(&ok, 50.0),
        p99: pct(&ok, 99.0),
        p999: pct(&ok, 99.9),
        max: ok.last().copied().unwrap_or(0),
        late_p99: pct(&late, 99.0),
        errors,
        svc_busy,
        gen_busy,
    }
}

// -- Redis time ------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Mode {
    Service,
    IncrExpire,
    GetFirst,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Service => "the service",
            Mode::IncrExpire => "INCRBY + EXPIRE",
            Mode::GetFirst => "GET, then INCRBY + EXPIRE",
        }
    }
}

#[derive(Clone, Copy, Default)]
struct RedisCell {
    cpu_ns: f64,
    cmd_us: f64,
    reads: f64,
    calls: f64,
    /// decisions that failed or were denied (none expected)
    errors: f64,
}

/// `INFO commandstats` and `INFO stats`: (sum of usec, sum of calls) over
/// the commands of a decision, and total_reads_processed.
async fn redis_counters(con: &mut Conn) -> (f64, f64, f64) {
    let s: String = redis::cmd("INFO").arg("commandstats").query_async(con).await.unwrap();
    let (mut us, mut calls) = (0.0, 0.0);
    for line in s.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else { continue };
        let Some((name, fields)) = rest.split_once(':') else { continue };
        if !matches!(name.to_ascii_lowercase().as_str(), "rl.multi" | "rl.fixedwindow" | "incrby" | "expire" | "get") {
            continue;
        }
        for f in fields.split(',') {
            if let Some(v) = f.strip_prefix("usec=") {
                us += v.parse::<f64>().unwrap_or(0.0);
            }
            if let Some(v) = f.strip_prefix("calls=") {
                calls += v.parse::<f64>().unwrap_or(0.0);
            }
        }
    }
    let st: String = redis::cmd("INFO").arg("stats").query_async(con).await.unwrap();
    let reads = st
        .lines()
        .find_map(|l| l.strip_prefix("total_reads_processed:"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    (us, calls, reads)
}

#[allow(clippy::too_many_arguments)]
async fn redis_cell(
    mode: Mode,
    n: usize,
    round: usize,
    cl: &Arc<Clients>,
    pool: &Arc<Pool>,
    info: &mut Conn,
    redis_pid: u32,
    idle_ns_per_s: f64,
    rate: f64,
    a: &Args,
) -> RedisCell {
    let count = a.redis_n;
    let keys = a.keys;
    // the same requests for the three modes of a round
    let base = 100_000_000 * (n as u64) + 1_000_000 * round as u64;
    let (us0, calls0, r0) = redis_counters(info).await;
    let c0 = cpu_ns(redis_pid);
    let t0 = Instant::now();
    let (lat, _) = match mode {
        Mode::Service => {
            let cl = cl.clone();
            open_loop(rate, count, move |i, _| {
                let mut c = cl.get(i);
                async move {
                    match c.should_rate_limit(bench_request(base + i, n, keys)).await {
                        Ok(r) if r.get_ref().overall_code == OK => 0,
                        _ => u64::MAX,
                    }
                }
            })
            .await
        }
        Mode::IncrExpire | Mode::GetFirst => {
            let pool = pool.clone();
            open_loop(rate, count, move |i, _| {
                let pool = pool.clone();
                async move {
                    let now = now_s();
                    let ks: Vec<String> = bench_entries(base + i, n, keys)
                        .iter()
                        .map(|e| envoy_key("", "bench", std::slice::from_ref(e), BENCH_UNIT_S, now))
                        .collect();
                    let (_permit, mut con) = pool.get().await;
                    let after =
                        envoy_decide(&mut con, &ks, &vec![BENCH_LIMIT; n], BENCH_UNIT_S, mode == Mode::GetFirst).await;
                    pool.put(con).await;
                    if after.iter().all(|&x| x <= BENCH_LIMIT) {
                        0
                    } else {
                        u64::MAX
                    }
                }
            })
            .await
        }
    };
    let el = t0.elapsed().as_secs_f64();
    let c1 = cpu_ns(redis_pid);
    let (us1, calls1, r1) = redis_counters(info).await;
    let errors = lat.iter().filter(|&&x| x == u64::MAX).count();
    let d = count as f64;
    RedisCell {
        cpu_ns: ((c1 - c0) as f64 - idle_ns_per_s * el).max(0.0) / d,
        cmd_us: (us1 - us0) / d,
        reads: (r1 - r0) / d,
        calls: (calls1 - calls0) / d,
        errors: errors as f64,
    }
}

/// redis-server with the module on core 0 (under callgrind with `callgrind`).
fn start_redis(a: &Args, dir: &Path, callgrind: bool) -> (Proc, u16) {
    let port = free_port();
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", "0"]);
    if callgrind {
        let out = dir.join("callgrind.out.%p");
        cmd.args(["valgrind", "--tool=callgrind", "--dump-instr=no"]).arg(format!("--callgrind-out-file={}", out.display()));
    }
    let mut p = Proc(
        cmd.args([&a.server, "--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--loadmodule", &a.module])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("taskset redis-server"),
    );
    wait_port(port, "redis-server", &mut p);
    (p, port)
}

/// The release service on core 1, on the Redis at `rport`.
fn start_service(a: &Args, dir: &Path, rport: u16) -> (Proc, u16) {
    start_service_in(a, dir, rport, &[], &[])
}

/// [`start_service`] run by `wrapper` (e.g. `valgrind --tool=callgrind …`),
/// with the variables `env` added.
fn start_service_in(a: &Args, dir: &Path, rport: u16, wrapper: &[String], env: &[(&str, &str)]) -> (Proc, u16) {
    let (gport, hport) = (free_port(), free_port());
    let mut p = Proc(
        Command::new("taskset")
            .args(["-c", "1"])
            .args(wrapper)
            .arg(&a.service)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs([
                ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
                ("REDIS_URL", format!("127.0.0.1:{rport}")),
                ("REDIS_TIMEOUT", "5s".to_owned()),
                ("GRPC_HOST", "127.0.0.1".to_owned()),
                ("GRPC_PORT", gport.to_string()),
                ("HOST", "127.0.0.1".to_owned()),
                ("PORT", hport.to_string()),
                ("RUNTIME_ROOT", dir.join("runtime").to_string_lossy().into_owned()),
                ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
                ("RUNTIME_APPDIRECTORY", "config".to_owned()),
            ])
            .envs(env.iter().copied())
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("taskset service"),
    );
    wait_port(gport, "redis-ratelimit-service", &mut p);
    (p, gport)
}

/// Puts every thread of each process of `pids` at SCHED_FIFO priority 10
/// (`on`), or back at SCHED_OTHER: the load generator and Redis during the
/// latency cells, so that the machine's other tasks (kernel workers, DAMON)
/// do not delay the harness; the service stays at normal priority. Threads
/// started later by a thread at SCHED_FIFO inherit it (the pacer). Err: the
/// first refusal (EPERM without CAP_SYS_NICE).
fn set_fifo(pids: &[u32], on: bool) -> Result<(), String> {
    for pid in pids {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| format!("/proc/{pid}/task: {e}"))?;
        for t in tasks.flatten() {
            let Ok(tid) = t.file_name().to_string_lossy().parse::<i32>() else { continue };
            set_policy(tid, on).map_err(|e| format!("sched_setscheduler({tid}): {e}"))?;
        }
    }
    Ok(())
}

/// Thread `tid` (0: this one) at SCHED_FIFO priority 10 (`fifo`), or at
/// SCHED_OTHER.
fn set_policy(tid: i32, fifo: bool) -> std::io::Result<()> {
    let (policy, prio) = if fifo { (libc::SCHED_FIFO, 10) } else { (libc::SCHED_OTHER, 0) };
    let param = libc::sched_param { sched_priority: prio };
    // SAFETY: a plain system call on a thread id with a valid sched_param.
    if unsafe { libc::sched_setscheduler(tid, policy, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Timer wake-ups of this core: a thread (at SCHED_FIFO 10 when `fifo`)
/// sleeps 100 µs again and again for `secs`; (sleeps, late by over 1 ms,
/// late by over 2 ms, the latest in ns). What the machine alone does to a
/// waiting task, at each priority.
fn wake_probe(secs: f64, fifo: bool) -> (u64, u64, u64, u64) {
    std::thread::spawn(move || {
        // (set either way: a thread inherits its creator's policy)
        if set_policy(0, fifo).is_err() {
            return (0, 0, 0, 0);
        }
        let (mut n, mut over1, mut over2, mut max) = (0, 0, 0, 0);
        let end = Instant::now() + Duration::from_secs_f64(secs);
        while Instant::now() < end {
            let t = Instant::now();
            std::thread::sleep(Duration::from_micros(100));
            let late = t.elapsed().as_nanos().saturating_sub(100_000) as u64;
            n += 1;
            over1 += u64::from(late > 1_000_000);
            over2 += u64::from(late > 2_000_000);
            max = max.max(late);
        }
        (n, over1, over2, max)
    })
    .join()
    .unwrap_or((0, 0, 0, 0))
}

/// Pins every thread of this process (and the threads it starts later) to `cpus`.
fn pin_self(cpus: &str) {
    let st = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &std::process::id().to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("taskset -a -p");
    assert!(st.success(), "taskset -a -p -c {cpus}: {st}");
}

/// `callgrind_control args`; `host`: the `HOST` the valgrind'd process
/// saw (valgrind names its vgdb pipes after it), when not this process's.
fn callgrind_control(args: &[&str], host: Option<&str>) {
    let mut c = Command::new("callgrind_control");
    if let Some(h) = host {
        c.env("HOST", h);
    }
    let st = c.args(args).stdout(Stdio::null()).stderr(Stdio::null()).status().expect("callgrind_control");
    assert!(st.success(), "callgrind_control {args:?}: {st}");
}

/// The newest callgrind dump under `dir`.
fn newest_dump(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("callgrind.out."))
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).unwrap_or(UNIX_EPOCH))
        .expect("a callgrind dump")
        .path()
}

/// The instructions of the newest callgrind dump under `dir` (its `totals:`).
fn callgrind_totals(dir: &Path) -> f64 {
    dump_totals(&std::fs::read_to_string(newest_dump(dir)).unwrap())
}

/// The instructions of a callgrind dump's text (its `totals:`, or `summary:`).
fn dump_totals(text: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix("totals:").or_else(|| l.strip_prefix("summary:")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("totals: in the callgrind dump")
}

/// Instructions the server runs per decision under callgrind (deterministic,
/// unlike CPU time on a shared machine): a second redis-server under
/// `valgrind --tool=callgrind` and a second service on it; per cell, the
/// keys are made by a first pass of the same requests, then the counters
/// are zeroed, `--cg-n` decisions sent one at a time (one round trip each:
/// two for the GET-first mode), and the counters dumped. User-space
/// instructions of the whole server (reading, parsing, the commands,
/// replies); the kernel's work is not counted (the reads column shows it).
async fn callgrind_phase(a: &Args, dir: &Path) -> HashMap<(Mode, usize), f64> {
    let cgdir = dir.join("cg");
    std::fs::create_dir_all(&cgdir).unwrap();
    let (redis, rport) = start_redis(a, &cgdir, true);
    let (_svc, gport) = start_service(a, dir, rport);
    let pid = redis.pid().to_string();
    let mut client = RateLimitServiceClient::new(
        Endpoint::from_shared(format!("http://127.0.0.1:{gport}")).unwrap().connect().await.unwrap(),
    );
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{rport}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (keys, count) = (200, a.cg_n);
    let mut out = HashMap::new();
    for n in [1, 2, 4] {
        for mode in [Mode::Service, Mode::IncrExpire, Mode::GetFirst] {
            let base = 500_000_000 + 1_000_000 * n as u64;
            for pass in 0..2 {
                if pass == 1 {
                    callgrind_control(&["-z", &pid], None);
                }
                let m = if pass == 0 { keys } else { count };
                for i in 0..m {
                    let j = base + i % keys;
                    if mode == Mode::Service {
                        let r = client.should_rate_limit(bench_request(j, n, keys)).await.expect("callgrind decision");
                        assert_eq!(r.get_ref().overall_code, OK);
                    } else {
                        let now = now_s();
                        let ks: Vec<String> = bench_entries(j, n, keys)
                            .iter()
                            .map(|e| envoy_key("", "bench", std::slice::from_ref(e), BENCH_UNIT_S, now))
                            .collect();
                        envoy_decide(&mut con, &ks, &vec![BENCH_LIMIT; n], BENCH_UNIT_S, mode == Mode::GetFirst).await;
                    }
                }
            }
            callgrind_control(&["-d", &pid], None);
            let ir = callgrind_totals(&cgdir) / count as f64;
            eprintln!("  callgrind n={n} {:<28} {:8.0} instructions/decision", mode.label(), ir);
            out.insert((mode, n), ir);
        }
    }
    out
}

/// The calls of a callgrind dump to each function named in `names`
/// (every caller's `calls=` lines under a `cfn=` of that name; names are
/// compressed as `(id) name` on first use, `(id)` after).
fn callgrind_calls(text: &str, names: &[&str]) -> HashMap<String, u64> {
    let mut by_id: HashMap<&str, &str> = HashMap::new();
    let mut callee = "";
    let mut out = HashMap::new();
    for l in text.lines() {
        let named = l.strip_prefix("fn=").map(|r| (false, r)).or_else(|| l.strip_prefix("cfn=").map(|r| (true, r)));
        if let Some((is_callee, r)) = named {
            let name = match r.strip_prefix('(').and_then(|r| r.split_once(')')) {
                Some((id, rest)) => {
                    let rest = rest.trim_start();
                    if !rest.is_empty() {
                        by_id.insert(id, rest);
                    }
                    by_id.get(id).copied().unwrap_or("")
                }
                None => r,
            };
            if is_callee {
                callee = name;
            }
        } else if let Some(r) = l.strip_prefix("calls=") {
            if names.contains(&callee) {
                let c: u64 = r.split_whitespace().next().and_then(|c| c.parse().ok()).unwrap_or(0);
                *out.entry(callee.to_owned()).or_insert(0) += c;
            }
        }
    }
    out
}

/// `--count-only N`: the release service under callgrind on a Redis with
/// the module (the bench's configuration); per descriptor count, a first
/// pass of the requests (connections, the limiter and the statistics' keys
/// made), the counters zeroed, N decisions one at a time, the counters
/// dumped: the service's instructions (user space, the whole process) and
/// heap allocations (malloc-family calls) per decision. Deterministic, so
/// that a change's effect shows on a shared machine.
async fn count_only(a: &Args, dir: &Path) {
    let cgdir = dir.join("cg-service");
    std::fs::create_dir_all(&cgdir).unwrap();
    let (_redis, rport) = start_redis(a, dir, false);
    let wrapper = [
        "valgrind".to_owned(),
        "--tool=callgrind".to_owned(),
        "--dump-instr=no".to_owned(),
        format!("--callgrind-out-file={}", cgdir.join("callgrind.out.%p").display()),
    ];
    // no reload polls in the counts (they are wall-clock driven)
    let (svc, gport) = start_service_in(a, dir, rport, &wrapper, &[("RUNTIME_POLL_INTERVAL", "24h")]);
    let pid = svc.pid().to_string();
    // valgrind names its vgdb pipes after $HOST, which the service's
    // environment sets: callgrind_control (vgdb) must see the same one
    let control = |cmd: &str| callgrind_control(&[cmd, &pid], Some("127.0.0.1"));
    let mut client = RateLimitServiceClient::new(
        Endpoint::from_shared(format!("http://127.0.0.1:{gport}")).unwrap().connect().await.unwrap(),
    );
    const ALLOC: [&str; 6] = ["malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc", "memalign"];
    let (keys, count) = (200, a.count_only);
    println!("service {}, {count} decisions per row, one at a time, under callgrind", a.service);
    println!("| descriptors | instructions/decision | allocations/decision | frees/decision |");
    println!("|---|---|---|---|");
    for n in [1, 2, 4] {
        let base = 700_000_000 + 1_000_000 * n as u64;
        for pass in 0..2 {
            if pass == 1 {
                control("-z");
            }
            for i in 0..if pass == 0 { keys } else { count } {
                let r = client.should_rate_limit(bench_request(base + i % keys, n, keys)).await.expect("decision");
                assert_eq!(r.get_ref().overall_code, OK);
            }
        }
        let dumps = std::fs::read_dir(&cgdir).unwrap().count();
        control("-d");
        // the dump is written by the service: wait for it, complete
        let t0 = Instant::now();
        let text = loop {
            if std::fs::read_dir(&cgdir).unwrap().count() > dumps {
                let t = std::fs::read_to_string(newest_dump(&cgdir)).unwrap();
                if t.lines().any(|l| l.starts_with("totals:") || l.starts_with("summary:")) {
                    break t;
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "no callgrind dump from the service");
            std::thread::sleep(Duration::from_millis(50));
        };
        let ir = dump_totals(&text);
        let calls = callgrind_calls(&text, &[&ALLOC[..], &["free"]].concat());
        let allocs: u64 = ALLOC.iter().filter_map(|f| calls.get(*f)).sum();
        let frees = calls.get("free").copied().unwrap_or(0);
        let per = |x: f64| x / count as f64;
        println!("| {n} | {:.0} | {:.2} | {:.2} |", per(ir), per(allocs as f64), per(frees as f64));
        eprintln!("  n={n}: {calls:?}, {}", newest_dump(&cgdir).display());
    }
}

// -- over-admission ------------------------------------------------------------------

/// The user of over-admission request j: three in four from "abuser", the
/// rest spread over 100 users (10 requests each for 4000).
fn oa_user(j: usize) -> String {
    if value(j as u64, 7, 4) != 0 {
        "abuser".into()
    } else {
        format!("u{}", value(j as u64, 8, 100))
    }
}

#[derive(Default, Clone)]
struct OaResult {
    /// grants per user key, and in total (the site key's grants)
    grants: HashMap<String, u64>,
    requests: HashMap<String, u64>,
    total_grants: u64,
    /// what the site counter holds at the end
    site_counter: u64,
    abuser_counter: u64,
    /// requests answered with an error (counted as not granted)
    errors: u64,
}

/// Waits until the service answers OK again (up to 10 s): after an
/// overload, the Rust client's breaker stays open for a second and then
/// probes; a phase starting meanwhile would only count UNAVAILABLE answers.
async fn settle(cl: &Arc<Clients>) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if let Ok(r) = cl.get(0).should_rate_limit(bench_request(u64::MAX / 2, 1, 1)).await {
            if r.get_ref().overall_code == OK {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("  the service did not answer OK within 10 s");
}

async fn oa_run(mode: Mode, cl: &Arc<Clients>, url: &str, a: &Args) -> OaResult {
    settle(cl).await;
    let m = a.oa_requests;
    let next = Arc::new(AtomicU64::new(0));
    let results: Arc<std::sync::Mutex<OaResult>> = Arc::default();
    let prefix = match mode {
        Mode::Service => "",
        Mode::IncrExpire => "incr:",
        Mode::GetFirst => "get:",
    };
    let client = redis::Client::open(url).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..a.oa_clients {
        let (next, results, cl) = (next.clone(), results.clone(), cl.clone());
        // one connection per concurrent client: many envoyproxy/ratelimit instances
        let mut con = client.get_multiplexed_async_connection().await.unwrap();
        tasks.push(tokio::spawn(async move {
            loop {
                let j = next.fetch_add(1, Relaxed) as usize;
                if j >= m {
                    break;
                }
                let user = oa_user(j);
                let entries = [("user".to_owned(), user.clone()), ("site".to_owned(), "all".to_owned())];
                let granted = match mode {
                    Mode::Service => {
                        let req = RateLimitRequest {
                            domain: "oa".into(),
                            descriptors: entries
                                .iter()
                                .map(|(k, v)| RateLimitDescriptor {
                                    entries: vec![Entry { key: k.clone(), value: v.clone() }],
                                    ..Default::default()
                                })
                                .collect(),
                            hits_addend: 0,
                        };
                        match cl.get(j as u64).should_rate_limit(req).await {
                            Ok(r) => r.get_ref().overall_code == OK,
                            Err(e) => {
                                eprintln!("  over-admission request {j}: {e}");
                                results.lock().unwrap().errors += 1;
                                false
                            }
                        }
                    }
                    _ => {
                        let now = now_s();
                        let ks: Vec<String> = entries
                            .iter()
                            .map(|e| envoy_key(prefix, "oa", std::slice::from_ref(e), OA_UNIT_S, now))
                            .collect();
                        let after =
                            envoy_decide(&mut con, &ks, &[OA_USER_LIMIT, OA_SITE_LIMIT], OA_UNIT_S, mode == Mode::GetFirst)
                                .await;
                        after[0] <= OA_USER_LIMIT && after[1] <= OA_SITE_LIMIT
                    }
                };
                let mut r = results.lock().unwrap();
                *r.requests.entry(user.clone()).or_default() += 1;
                if granted {
                    *r.grants.entry(user).or_default() += 1;
                    r.total_grants += 1;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut r = results.lock().unwrap().clone();
    // the counters at the end
    let now = now_s();
    match mode {
        Mode::Service => {
            // a check-only request (hits_addend 0 per descriptor): limit − remaining
            let req = RateLimitRequest {
                domain: "oa".into(),
                descriptors: [("user", "abuser"), ("site", "all")]
                    .iter()
                    .map(|(k, v)| RateLimitDescriptor {
                        entries: vec![Entry { key: (*k).into(), value: (*v).into() }],
                        hits_addend: Some(UInt64Value { value: 0 }),
                        ..Default::default()
                    })
                    .collect(),
                hits_addend: 0,
            };
            settle(cl).await;
            match cl.get(0).should_rate_limit(req).await {
                Ok(resp) => {
                    let resp = resp.into_inner();
                    r.abuser_counter = OA_USER_LIMIT - u64::from(resp.statuses[0].limit_remaining);
                    r.site_counter = OA_SITE_LIMIT - u64::from(resp.statuses[1].limit_remaining);
                }
                Err(e) => {
                    eprintln!("  over-admission: the counters could not be read: {e}");
                    r.errors += 1;
                }
            }
        }
        _ => {
            let mut con = client.get_multiplexed_async_connection().await.unwrap();
            let k = |e: (&str, &str)| envoy_key(prefix, "oa", &[(e.0.to_owned(), e.1.to_owned())], OA_UNIT_S, now);
            let (ua, site): (Option<u64>, Option<u64>) = redis::pipe()
                .cmd("GET")
                .arg(k(("user", "abuser")))
                .cmd("GET")
                .arg(k(("site", "all")))
                .query_async(&mut con)
                .await
                .unwrap();
            r.abuser_counter = ua.unwrap_or(0);
            r.site_counter = site.unwrap_or(0);
        }
    }
    r
}

// -- the run ----------------------------------------------------------------------------

fn f0(x: f64) -> String {
    let s = format!("{:.0}", x);
    // thousands separators
    let (neg, digits) = s.strip_prefix('-').map(|d| (true, d)).unwrap_or((false, &s));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if neg {
        format!("-{out}")
    } else {
        out
    }
}

fn ms(ns: u64) -> String {
    format!("{:.2}", ns as f64 / 1e6)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn server_version(bin: &str) -> String {
    Command::new(bin)
        .arg("--version")
        .output()
        .map(|o| {
            let s = String::from_utf8_lossy(&o.stdout);
            let name = if s.to_ascii_lowercase().contains("valkey") { "Valkey" } else { "Redis" };
            let v = s.split_whitespace().find_map(|w| w.strip_prefix("v=")).unwrap_or("?").to_owned();
            format!("{name} {v}")
        })
        .unwrap_or_else(|_| bin.to_owned())
}

fn main() {
    let a = parse_args();
    let started = now_s();
    let load_start = loadavg();
    let dir = std::env::temp_dir().join(format!("rl-bench-envoy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("runtime/ratelimit/config")).unwrap();
    for (name, text) in config_yaml() {
        std::fs::write(dir.join("runtime/ratelimit/config").join(name), text).unwrap();
    }
    assert!(
        Path::new(&a.service).exists(),
        "no service binary at {} (cargo build --release -p redis-ratelimit-service)",
        a.service
    );
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    if a.count_only > 0 {
        // the dumps stay, for callgrind_annotate
        rt.block_on(count_only(&a, &dir));
        return;
    }
    let (redis, rport) = start_redis(&a, &dir, false);
    let (svc, gport) = start_service(&a, &dir, rport);
    let workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let url = format!("redis://127.0.0.1:{rport}/");
    let out = rt.block_on(async {
        let mut chans = Vec::new();
        for _ in 0..a.conns.max(1) {
            chans.push(Endpoint::from_shared(format!("http://127.0.0.1:{gport}")).unwrap().connect().await.unwrap());
        }
        let cl = Arc::new(Clients(chans.iter().cloned().map(RateLimitServiceClient::new).collect(), chans));
        let mut report = Vec::<String>::new();
        let mut say = |s: String| {
            println!("{s}");
            report.push(s);
        };
        eprintln!(
            "bench-envoy: {} with {}, service {} (pid {}, core 1), load generator {} worker(s); load average {}",
            server_version(&a.server),
            a.module,
            a.service,
            svc.pid(),
            workers,
            load_start
        );
        // 1. max
        let mut maxes = Vec::new();
        for n in [1, 2, 4] {
            settle(&cl).await;
            let m = max_cell(&cl, svc.pid(), n, &a).await;
            eprintln!(
                "  max n={n}: {:.0}/s, service CPU {:.1} us/decision ({:.0}% of its core), errors {}",
                m.rate,
                m.svc_cpu_ns_per_dec / 1e3,
                m.svc_util * 100.0,
                m.errors
            );
            maxes.push(m);
        }
        // 2. latency: at --lat-rate (the target's half load) the control and
        // 1, 2, 4 descriptors, interleaved, --lat-rounds rounds; then once at half each max
        let say_lat = |round: &str, l: &LatCell| {
            eprintln!(
                "  latency{round} {} at {:.0}/s: p50 {} ms p99 {} ms p99.9 {} ms max {} ms (pacer late p99 {} ms), errors {}",
                if l.n == 0 { "control (health check)".to_owned() } else { format!("n={}", l.n) },
                l.rate,
                ms(l.p50),
                ms(l.p99),
                ms(l.p999),
                ms(l.max),
                ms(l.late_p99),
                l.errors
            )
        };
        // what the machine does to a waiting task on core 0, at each priority
        let probe_secs = if a.quick { 2.0 } else { 5.0 };
        let probes = [wake_probe(probe_secs, false), wake_probe(probe_secs, true)];
        eprintln!("  wake-up probe, core 0, normal / SCHED_FIFO (sleeps, >1 ms, >2 ms, max ns): {probes:?}");
        // with --fifo, the harness (this process and Redis) at SCHED_FIFO
        // for the cells at the first load; the service at normal priority
        let harness = [std::process::id(), redis.pid()];
        let fifo = if a.fifo { set_fifo(&harness, true) } else { Err("normal priority".into()) };
        if let (true, Err(e)) = (a.fifo, &fifo) {
            let _ = set_fifo(&harness, false);
            eprintln!("  latency: the load generator and Redis at normal priority ({e})");
        }
        let mut at_target: Vec<Vec<LatCell>> = (0..4).map(|_| Vec::new()).collect();
        if a.lat_rate > 0.0 {
            for round in 0..a.lat_rounds.max(1) {
                for (cells, n) in at_target.iter_mut().zip([0, 1, 2, 4]) {
                    settle(&cl).await;
                    let l = lat_cell(&cl, svc.pid(), n, a.lat_rate, &a).await;
                    say_lat(&format!(" round {round}"), &l);
                    cells.push(l);
                }
            }
        }
        // each row: the round whose p99 is the median, with every round's p99
        let median_round = |mut cells: Vec<LatCell>| {
            let p99s = cells.iter().map(|l| l.p99).collect();
            cells.sort_by_key(|l| l.p99);
            (cells.swap_remove(cells.len() / 2), p99s)
        };
        let mut lats: Vec<(String, LatCell, Vec<u64>)> = Vec::new();
        for cells in at_target.into_iter().filter(|c| !c.is_empty()) {
            let (l, p99s) = median_round(cells);
            lats.push((lat_label(l.n, ""), l, p99s));
        }
        // back at normal priority: at half each max, core 0 is busy enough
        // that SCHED_FIFO would hit the kernel's real-time throttling (95%
        // of each second), which stalls the harness for tens of ms
        let _ = set_fifo(&harness, false);
        for m in &maxes {
            settle(&cl).await;
            let l = lat_cell(&cl, svc.pid(), m.n, m.rate / 2.0, &a).await;
            say_lat("", &l);
            let p99s = vec![l.p99];
            lats.push((lat_label(l.n, ""), l, p99s));
        }
        // overload: 1 descriptor at twice its max for 1 s. The backlog
        // drains (its latency is queueing) and every request is answered:
        // no connection closed under it (server::MAX_CONCURRENT_STREAMS)
        if let Some(m) = maxes.iter().find(|m| m.n == 1) {
            settle(&cl).await;
            let l = lat_cell(&cl, svc.pid(), 1, m.rate * 2.0, &Args { lat_secs: 1.0, ..a.clone() }).await;
            say_lat(" overload", &l);
            let p99s = vec![l.p99];
            lats.push((lat_label(1, " (overload: twice the max, 1 s)"), l, p99s));
        }
        // the comparison: the control and 1 descriptor at the first load
        // with the harness at normal priority
        if fifo.is_ok() && a.lat_rate > 0.0 {
            let mut normal: Vec<Vec<LatCell>> = (0..2).map(|_| Vec::new()).collect();
            for round in 0..a.lat_rounds.max(1) {
                for (cells, n) in normal.iter_mut().zip([0, 1]) {
                    settle(&cl).await;
                    let l = lat_cell(&cl, svc.pid(), n, a.lat_rate, &a).await;
                    say_lat(&format!(" round {round}, normal priority,"), &l);
                    cells.push(l);
                }
            }
            for cells in normal {
                let (l, p99s) = median_round(cells);
                lats.push((lat_label(l.n, ", harness at normal priority"), l, p99s));
            }
        }
        // 3. Redis time per decision
        let pool = Pool::new(&url, a.pool).await;
        let mut info = redis::Client::open(url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
        let c0 = cpu_ns(redis.pid());
        tokio::time::sleep(Duration::from_secs(1)).await;
        let idle = (cpu_ns(redis.pid()) - c0) as f64;
        // the load generator moves to the service's core for these cells, so
        // that Redis has core 0 to itself whichever workload runs (else the
        // gRPC cells, whose client is heavier, would slow Redis down more)
        pin_self("1");
        let mut cells: HashMap<(Mode, usize), Vec<RedisCell>> = HashMap::new();
        // the same offered load for the three workloads: --redis-rate, or half the service's max at n
        let rates: HashMap<usize, f64> =
            maxes.iter().map(|m| (m.n, if a.redis_rate > 0.0 { a.redis_rate } else { (m.rate / 2.0).max(100.0) })).collect();
        for round in 0..a.rounds {
            for n in [1, 2, 4] {
                for mode in [Mode::Service, Mode::IncrExpire, Mode::GetFirst] {
                    settle(&cl).await;
                    let c = redis_cell(mode, n, round, &cl, &pool, &mut info, redis.pid(), idle, rates[&n], &a).await;
                    eprintln!(
                        "  redis round {round} n={n} {:<28} {:6.2} us CPU, {:5.2} us in commands, {:.2} reads, {:.1} calls /decision",
                        mode.label(),
                        c.cpu_ns / 1e3,
                        c.cmd_us,
                        c.reads,
                        c.calls
                    );
                    cells.entry((mode, n)).or_default().push(c);
                }
            }
        }
        pin_self("0");
        let med = |mode: Mode, n: usize, f: fn(&RedisCell) -> f64| median(cells[&(mode, n)].iter().map(f).collect());
        // 4. over-admission
        let day0 = now_s() / OA_UNIT_S;
        let mut oa = Vec::new();
        for mode in [Mode::Service, Mode::IncrExpire, Mode::GetFirst] {
            oa.push((mode, oa_run(mode, &cl, &url, &a).await));
        }
        let crossed = now_s() / OA_UNIT_S != day0;
        // 5. instructions per decision under callgrind
        let cg = if a.cg_n > 0 { callgrind_phase(&a, &dir).await } else { HashMap::new() };
        let load_end = loadavg();
        let up = uptime();

        // the table
        say(format!(
            "Run on {} ({}, {} cores; redis-server on core 0 with the load generator, the service on core 1; for the Redis-time cells the load generator moves to core 1). \
             Load average {} at the start, {} at the end (`uptime`: {}).",
            utc(started),
            server_version(&a.server),
            std::fs::read_to_string("/proc/cpuinfo").map(|c| c.matches("\nprocessor").count() + 1).unwrap_or(0),
            load_start,
            load_end,
            up
        ));
        say(String::new());
        say(format!(
            "**The service** (`taskset -c 1`: one CPU, so tokio's single-threaded runtime): max decisions/s closed loop ({} in flight over {} HTTP/2 \
             connections, {:.0} s per cell) and its CPU per decision. Errors: answers other than OK.",
            a.inflight, a.conns, a.max_secs
        ));
        say(String::new());
        say("| descriptors | max decisions/s | service CPU µs/decision | = decisions per core-second | service core busy | errors |".into());
        say("|---:|---:|---:|---:|---:|---:|".into());
        for m in &maxes {
            say(format!(
                "| {} | {} | {:.1} | {} | {:.0}% | {} |",
                m.n,
                f0(m.rate),
                m.svc_cpu_ns_per_dec / 1e3,
                f0(1e9 / m.svc_cpu_ns_per_dec),
                m.svc_util * 100.0,
                m.errors
            ));
        }
        say(String::new());
        say(format!(
            "**Latency** end to end at a fixed offered load (open loop, from each request's due time, {:.0} s per cell){}, \
             then once at half each max, then 1 descriptor at twice its max for 1 s (overload: a backlog that drains, \
             so its latency is queueing; an answer other than OK there, such as a closed connection, is an error). The control: the gRPC health check (`grpc.health.v1.Health/Check`) at the first \
             load, on the same connections and server, without Redis: the latency of the transport, the load generator \
             and the machine, which every decision carries too. Generator late: how late the pacing thread started requests, counted in the latency. \
             Busy: CPU use of the service and of the load generator during the cell, 100% = one core (a generator near \
             100% means the latency is partly its own). Errors: answers other than OK. {}",
            a.lat_secs,
            if a.lat_rate > 0.0 {
                format!(
                    ": {} decisions/s, half the target's 20,000, in {} interleaved rounds (the row: the round with the \
                     median p99)",
                    f0(a.lat_rate),
                    a.lat_rounds.max(1)
                )
            } else {
                String::new()
            },
            match &fifo {
                Ok(()) => format!(
                    "In the cells at the first load, the load generator and Redis (core 0) run at `SCHED_FIFO` \
                           priority 10, so that the machine's other tasks (kernel workers, DAMON) do not delay the \
                           harness (measured first on core 0, {probe_secs:.0} s of 100 µs sleeps at each \
                           priority: {} at normal priority, {} at `SCHED_FIFO`). The service (core 1) stays at normal priority, as \
                           deployed. The cells at half each max run at normal priority (there core 0 is busy enough for \
                           the kernel's real-time throttling to stall a `SCHED_FIFO` harness), and the last rows repeat \
                           the control and 1 descriptor at the first load with the harness at normal priority.",
                    probe_text(probes[0]),
                    probe_text(probes[1])
                ),
                Err(e) => format!(
                    "The load generator and Redis run at normal priority{}. What the machine alone does to a waiting \
                     task on core 0, measured first ({probe_secs:.0} s of 100 µs sleeps at each priority): {} at \
                     normal priority, {} at `SCHED_FIFO`; each such stall of a few ms delays every request due \
                     during it. (`ARGS=--fifo` runs the cells at the first load with the load generator and Redis at \
                     `SCHED_FIFO`: on a quiet machine their p99 fell to 0.44–0.87 ms, but at this load core 0 is \
                     near the kernel's real-time budget of 95% a second, and a throttled harness stalls for tens \
                     of ms.)",
                    if a.fifo { format!(" ({e})") } else { String::new() },
                    probe_text(probes[0]),
                    probe_text(probes[1])
                ),
            }
        ));
        say(String::new());
        say("| descriptors | offered/s | achieved/s | p50 ms | p99 ms | p99 ms of each round | p99.9 ms | max ms | generator late p99 ms | service / generator busy | errors |".into());
        say("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|".into());
        for (label, l, p99s) in &lats {
            say(format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0}% / {:.0}% | {} |",
                label,
                f0(l.rate),
                f0(l.achieved),
                ms(l.p50),
                ms(l.p99),
                p99s.iter().map(|&x| ms(x)).collect::<Vec<_>>().join(", "),
                ms(l.p999),
                ms(l.max),
                ms(l.late_p99),
                l.svc_busy * 100.0,
                l.gen_busy * 100.0,
                l.errors
            ));
        }
        say(String::new());
        say(format!(
            "**Redis server time per decision**, the service's `RL.MULTI` (one fixed-window descriptor: `RL.FIXEDWINDOW`) \
             against envoyproxy/ratelimit's workload replayed from the same requests. Instructions: redis-server under \
             callgrind (a second server, and a second service on it), user-space instructions of the whole server per \
             decision (reading, parsing, commands, replies; not the kernel's work), {} decisions one at a time on 200 \
             existing keys per descriptor key: deterministic, the figure to compare on a shared machine. Then on the \
             real server, the load generator moved to the service's core (core 0: Redis alone) ({} decisions per cell at the offered load below, open loop, {} keys per descriptor key, {} \
             connections for the replay; median of {} interleaved rounds). CPU: the redis-server process's CPU time \
             (`/proc/PID/task/*/schedstat`, user + system, minus its idle rate of {:.2} ms/s) per decision: everything \
             the server does for it. In commands: `INFO commandstats` usec per decision (time inside the commands only). \
             Reads: `total_reads_processed` per decision.",
            f0(a.cg_n as f64),
            f0(a.redis_n as f64),
            a.keys,
            a.pool,
            a.rounds,
            idle / 1e6
        ));
        say(String::new());
        say("| descriptors | workload | instructions/decision (callgrind) | × INCRBY + EXPIRE | offered/s | CPU µs/decision | × INCRBY + EXPIRE | µs in commands | × INCRBY + EXPIRE | calls | reads | errors |".into());
        say("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|".into());
        for n in [1, 2, 4] {
            let base_cpu = med(Mode::IncrExpire, n, |c| c.cpu_ns);
            let base_us = med(Mode::IncrExpire, n, |c| c.cmd_us);
            for mode in [Mode::Service, Mode::IncrExpire, Mode::GetFirst] {
                let cpu = med(mode, n, |c| c.cpu_ns);
                let us = med(mode, n, |c| c.cmd_us);
                say(format!(
                    "| {n} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.2} | {:.0} |",
                    mode.label(),
                    cg.get(&(mode, n)).map(|&x| f0(x)).unwrap_or_else(|| "–".into()),
                    match (cg.get(&(mode, n)), cg.get(&(Mode::IncrExpire, n))) {
                        (Some(x), Some(b)) => format!("{:.2}", x / b),
                        _ => "–".into(),
                    },
                    f0(rates[&n]),
                    cpu / 1e3,
                    cpu / base_cpu,
                    us,
                    us / base_us,
                    med(mode, n, |c| c.calls),
                    med(mode, n, |c| c.reads),
                    cells[&(mode, n)].iter().map(|c| c.errors).sum::<f64>()
                ));
            }
        }
        say(String::new());
        say(format!(
            "**Over-admission** under {} concurrent clients ({} requests; each request: `user` (limit {OA_USER_LIMIT}/day) \
             and `site` (limit {OA_SITE_LIMIT}/day); three in four from one user, `abuser`, the rest from 100 users). \
             Granted: requests answered OK. The site counter: what the site-wide key holds at the end (the service: \
             limit − remaining of a check-only request).{}",
            a.oa_clients,
            a.oa_requests,
            if crossed { " **The run crossed a day boundary: counts are split.**" } else { "" }
        ));
        say(String::new());
        say("| model | abuser granted / limit | abuser counter | other users: granted / asked | site granted / limit | site counter | over-admitted | site units taken by denied requests | errors |".into());
        say("|---|---:|---:|---:|---:|---:|---:|---:|---:|".into());
        for (mode, r) in &oa {
            let abuser = r.grants.get("abuser").copied().unwrap_or(0);
            let others: u64 = r.grants.iter().filter(|(k, _)| *k != "abuser").map(|(_, v)| v).sum();
            let asked: u64 = r.requests.iter().filter(|(k, _)| *k != "abuser").map(|(_, v)| v).sum();
            let over_user: u64 = r.grants.iter().filter(|(k, _)| *k != "abuser").map(|(_, &v)| v.saturating_sub(OA_USER_LIMIT)).sum::<u64>()
                + abuser.saturating_sub(OA_USER_LIMIT);
            let over = over_user + r.total_grants.saturating_sub(OA_SITE_LIMIT);
            say(format!(
                "| {} | {} / {OA_USER_LIMIT} | {} | {} / {} | {} / {OA_SITE_LIMIT} | {} | {} | {} | {} |",
                mode.label(),
                abuser,
                r.abuser_counter,
                others,
                asked,
                r.total_grants,
                r.site_counter,
                over,
                r.site_counter.saturating_sub(r.total_grants),
                r.errors
            ));
        }
        report
    });
    drop(svc);
    drop(redis);
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(path) = &a.write {
        write_section(path, &a, &out);
        eprintln!("wrote the bench-envoy section of {}", path.display());
    }
}

const BEGIN: &str = "<!-- bench-envoy:begin -->";
const END: &str = "<!-- bench-envoy:end -->";

fn write_section(path: &Path, a: &Args, table: &[String]) {
    let mut body = vec![
        BEGIN.to_owned(),
        "## The Envoy rate-limit service (`make bench-envoy`)".to_owned(),
        String::new(),
        "Generated by `make bench-envoy` (`service/benches/envoy.rs`; `make bench-envoy ARGS=\"--help\"` lists its \
         parameters). The service is the release build (`cargo build --release -p redis-ratelimit-service`, as users \
         build it), started as a process; the load generator is the quick profile. Targets (issue 32): at least 20,000 \
         decisions/s on one core at 1 descriptor with p99 under 2 ms at half that load; Redis time per decision at most \
         the `INCRBY` + `EXPIRE` pipeline's at 1, 2 and 4 descriptors and below the `GET`-first mode's; no \
         over-admission."
            .to_owned(),
        String::new(),
    ];
    if !a.note.is_empty() {
        body.push(a.note.clone());
        body.push(String::new());
    }
    if a.quick {
        body.push("**A --quick run: short cells, numbers only show that the bench works.**".into());
        body.push(String::new());
    }
    body.extend(table.iter().cloned());
    body.push(END.to_owned());
    let new = body.join("\n") + "\n";
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let s = match (s.find(BEGIN), s.find(END)) {
        (Some(x), Some(y)) if x < y => {
            let mut e = y + END.len();
            if s[e..].starts_with('\n') {
                e += 1;
            }
            format!("{}{}{}", &s[..x], new, &s[e..])
        }
        _ => format!("{}\n\n{}", s.trim_end_matches('\n'), new),
    };
    std::fs::write(path, s).unwrap();
}
