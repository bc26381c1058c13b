//! The workload: the bench domain's requests and configuration, and
//! envoyproxy/ratelimit's fixed-window cache replayed straight to Redis.

use super::*;

/// The value of descriptor `i` of request `j` (one of `keys`), the same for
/// the service and the replay.
pub(crate) fn value(j: u64, i: usize, keys: u64) -> u64 {
    let mut x = j.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((i as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    x ^= x >> 31;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 29;
    x % keys
}

/// The bench domain: descriptor keys k0..k3, each limited per hour far
/// above what a run sends (every decision is granted).
pub(crate) const BENCH_LIMIT: u64 = 4_000_000_000;
pub(crate) const BENCH_UNIT_S: u64 = 3600;
/// The over-admission domain: a user limit and a site-wide limit per day.
pub(crate) const OA_USER_LIMIT: u64 = 100;
pub(crate) const OA_SITE_LIMIT: u64 = 1000;
pub(crate) const OA_UNIT_S: u64 = 86400;

/// The two configuration files: the bench domain and the over-admission domain.
pub(crate) fn config_yaml() -> [(&'static str, String); 2] {
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

pub(crate) fn bench_request(j: u64, n: usize, keys: u64) -> RateLimitRequest {
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
pub(crate) fn envoy_key(prefix: &str, domain: &str, entries: &[(String, String)], unit_s: u64, now: u64) -> String {
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

pub(crate) fn bench_entries(j: u64, n: usize, keys: u64) -> Vec<(String, String)> {
    (0..n).map(|i| (format!("k{i}"), format!("v{}", value(j, i, keys)))).collect()
}

/// One decision of envoyproxy/ratelimit's fixed-window cache on Redis:
/// `INCRBY` + `EXPIRE` per descriptor in one pipeline; with `get_first`
/// (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`) a `GET` pipeline first, and
/// when a key would pass its limit, only the keys that would are
/// incremented (the others `INCRBY 0`), as its `getHitsAddend` does.
/// Returns the counts after the increment (its `limitAfterIncrease`).
pub(crate) async fn envoy_decide(con: &mut Conn, keys: &[String], limits: &[u64], unit_s: u64, get_first: bool) -> Vec<u64> {
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
pub(crate) struct Pool {
    pub(crate) free: tokio::sync::Mutex<Vec<Conn>>,
    pub(crate) sem: tokio::sync::Semaphore,
}

impl Pool {
    pub(crate) async fn new(url: &str, size: usize) -> Arc<Pool> {
        let client = redis::Client::open(url).unwrap();
        let mut v = Vec::new();
        for _ in 0..size {
            v.push(client.get_multiplexed_async_connection().await.unwrap());
        }
        Arc::new(Pool { free: tokio::sync::Mutex::new(v), sem: tokio::sync::Semaphore::new(size) })
    }
    pub(crate) async fn get(&self) -> (tokio::sync::SemaphorePermit<'_>, Conn) {
        let permit = self.sem.acquire().await.unwrap();
        let c = self.free.lock().await.pop().unwrap();
        (permit, c)
    }
    pub(crate) async fn put(&self, c: Conn) {
        self.free.lock().await.push(c);
    }
}
