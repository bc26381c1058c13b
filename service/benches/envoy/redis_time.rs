//! Redis time per decision: the service's RL.MULTI against the replayed
//! INCRBY + EXPIRE pipelines, from the same requests.

use super::*;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Mode {
    Service,
    IncrExpire,
    GetFirst,
}

impl Mode {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Mode::Service => "the service",
            Mode::IncrExpire => "INCRBY + EXPIRE",
            Mode::GetFirst => "GET, then INCRBY + EXPIRE",
        }
    }
}

#[derive(Clone, Copy, Default)]
pub(crate) struct RedisCell {
    pub(crate) cpu_ns: f64,
    pub(crate) cmd_us: f64,
    pub(crate) reads: f64,
    pub(crate) calls: f64,
    /// decisions that failed or were denied (none expected)
    pub(crate) errors: f64,
}

/// `INFO commandstats` and `INFO stats`: (sum of usec, sum of calls) over
/// the commands of a decision, and total_reads_processed.
pub(crate) async fn redis_counters(con: &mut Conn) -> (f64, f64, f64) {
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
pub(crate) async fn redis_cell(
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
