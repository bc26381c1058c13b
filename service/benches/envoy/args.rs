//! The bench's arguments (`--name value`).

use super::*;

pub(crate) fn usage() -> &'static str {
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
  --envoy-ratelimit PATH  envoyproxy/ratelimit's binary for the side-by-side
                    phase (default: $ENVOY_RATELIMIT_BIN; unset: no such phase)
  --side-only       only the side-by-side phase (needs the binary)
  --scale-only      only phase 7: a 3-primary cluster (the spread, across
                    slots) and the local over-limit cache (scale.rs)
  --scale-users N   users per row of the cluster-scaling table (default 2000; quick 300)
  --cache-rate R    the abusive client's requests/s (default 2000)
  --cache-secs S    its run, per service (default 5; quick 2)
  --count-only N    only this: the service under callgrind (Redis as usual),
                    N decisions at 1, 2 and 4 descriptors, one at a time, and
                    its instructions and allocations (malloc, calloc, realloc,
                    posix_memalign calls) per decision, whole process"
}

#[derive(Clone)]
pub(crate) struct Args {
    pub(crate) quick: bool,
    pub(crate) server: String,
    pub(crate) module: String,
    pub(crate) service: String,
    pub(crate) max_secs: f64,
    pub(crate) lat_secs: f64,
    pub(crate) conns: usize,
    pub(crate) inflight: usize,
    pub(crate) keys: u64,
    pub(crate) redis_rate: f64,
    pub(crate) lat_rate: f64,
    pub(crate) lat_rounds: usize,
    pub(crate) fifo: bool,
    pub(crate) redis_n: u64,
    pub(crate) rounds: usize,
    pub(crate) pool: usize,
    pub(crate) oa_clients: usize,
    pub(crate) oa_requests: usize,
    pub(crate) cg_n: u64,
    pub(crate) count_only: u64,
    pub(crate) envoy_bin: Option<String>,
    pub(crate) side_only: bool,
    pub(crate) scale_only: bool,
    pub(crate) scale_users: u64,
    pub(crate) cache_rate: f64,
    pub(crate) cache_secs: f64,
    pub(crate) write: Option<PathBuf>,
    pub(crate) note: String,
}

pub(crate) fn parse_args() -> Args {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut kv: HashMap<String, String> = HashMap::new();
    let mut quick = false;
    let mut fifo = false;
    let mut side_only = false;
    let mut scale_only = false;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--bench" => {} // cargo bench passes it
            "--quick" => quick = true,
            "--fifo" => fifo = true,
            "--side-only" => side_only = true,
            "--scale-only" => scale_only = true,
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
        envoy_bin: kv
            .get("envoy-ratelimit")
            .cloned()
            .or_else(|| std::env::var("ENVOY_RATELIMIT_BIN").ok())
            .filter(|b| !b.is_empty()),
        side_only,
        scale_only,
        scale_users: num("scale-users", q(2000.0, 300.0)) as u64,
        cache_rate: num("cache-rate", 2000.0),
        cache_secs: num("cache-secs", q(5.0, 2.0)),
        write: kv.get("write").map(PathBuf::from),
        note: kv.get("note").cloned().unwrap_or_default(),
    }
}
