//! envoyproxy/ratelimit itself beside the service (`ENVOY_RATELIMIT_BIN`:
//! a binary built by hand from its public source; this repository carries
//! neither its code nor a recipe that builds it). Both on core 1, each on a
//! Redis of its own on core 0 (the same server binary and module; upstream
//! sends plain `INCRBY` + `EXPIRE`), both alive through the phase, their
//! cells interleaved: max decisions/s closed loop and each one's CPU per
//! decision; p50/p99 at the same offered load (half the slower one's max);
//! and during those latency cells, Redis's CPU and time in commands per
//! decision.

use super::*;

/// One implementation under test.
pub(crate) struct Side {
    pub(crate) label: &'static str,
    pub(crate) svc: Proc,
    pub(crate) redis: Proc,
    pub(crate) info: Conn,
    pub(crate) cl: Arc<Clients>,
}

/// envoyproxy/ratelimit on core 1, on the Redis at `rport`, reading the
/// bench's configuration files.
pub(crate) fn start_upstream(bin: &str, dir: &Path, rport: u16) -> (Proc, u16) {
    let (gport, hport, dport) = (free_port(), free_port(), free_port());
    let mut p = Proc(
        Command::new("taskset")
            .args(["-c", "1", bin])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs([
                ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
                ("REDIS_URL", format!("127.0.0.1:{rport}")),
                ("GRPC_HOST", "127.0.0.1".to_owned()),
                ("GRPC_PORT", gport.to_string()),
                ("HOST", "127.0.0.1".to_owned()),
                ("PORT", hport.to_string()),
                ("DEBUG_HOST", "127.0.0.1".to_owned()),
                ("DEBUG_PORT", dport.to_string()),
                ("RUNTIME_ROOT", dir.join("runtime").to_string_lossy().into_owned()),
                ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
                ("RUNTIME_WATCH_ROOT", "false".to_owned()),
                ("LOG_LEVEL", "error".to_owned()),
                // no statistics (gostats's null sink): with USE_STATSD=false alone it
                // would write every timer to its log, a cost the service does not pay
                ("DISABLE_STATS", "true".to_owned()),
            ])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("ENVOY_RATELIMIT_BIN={bin}: {e}")),
    );
    wait_port(gport, "envoyproxy/ratelimit", &mut p);
    (p, gport)
}

async fn clients(gport: u16, conns: usize) -> Arc<Clients> {
    let mut chans = Vec::new();
    for _ in 0..conns.max(1) {
        chans.push(Endpoint::from_shared(format!("http://127.0.0.1:{gport}")).unwrap().connect().await.unwrap());
    }
    Arc::new(Clients(chans.iter().cloned().map(RateLimitServiceClient::new).collect(), chans))
}

/// A latency cell with Redis's work during it.
struct SideLat {
    l: LatCell,
    redis_cpu_ns: f64,
    redis_us: f64,
    redis_calls: f64,
}

/// The phase: both sides' figures, as the lines of a table.
pub(crate) async fn side_by_side(a: &Args, dir: &Path, bin: &str) -> Vec<String> {
    let mut sides = Vec::new();
    for label in ["redis-ratelimit-service", "envoyproxy/ratelimit"] {
        let (redis, rport) = start_redis(a, dir, false);
        let (svc, gport) =
            if label == "envoyproxy/ratelimit" { start_upstream(bin, dir, rport) } else { start_service(a, dir, rport) };
        let info = redis::Client::open(format!("redis://127.0.0.1:{rport}/"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let cl = clients(gport, a.conns).await;
        settle(&cl).await;
        sides.push(Side { label, svc, redis, info, cl });
    }
    let ns = [1usize, 2, 4];
    // max, interleaved
    let mut maxes: HashMap<(usize, usize), MaxCell> = HashMap::new();
    for &n in &ns {
        for (s, side) in sides.iter().enumerate() {
            settle(&side.cl).await;
            let m = max_cell(&side.cl, side.svc.pid(), n, a).await;
            eprintln!(
                "  side by side, max n={n} {}: {:.0}/s, CPU {:.1} us/decision, errors {}",
                side.label,
                m.rate,
                m.svc_cpu_ns_per_dec / 1e3,
                m.errors
            );
            maxes.insert((s, n), m);
        }
    }
    // latency at the same offered load: half the slower one's max at n
    let mut lats: HashMap<(usize, usize), SideLat> = HashMap::new();
    let mut rates = HashMap::new();
    for &n in &ns {
        let rate = ((0..sides.len()).map(|s| maxes[&(s, n)].rate).fold(f64::INFINITY, f64::min) / 2.0).max(100.0);
        rates.insert(n, rate);
        for (s, side) in sides.iter_mut().enumerate() {
            settle(&side.cl).await;
            let c0 = cpu_ns(side.redis.pid());
            let (us0, calls0, _) = redis_counters(&mut side.info).await;
            let t0 = Instant::now();
            let l = lat_cell(&side.cl, side.svc.pid(), n, rate, a).await;
            let el = t0.elapsed().as_secs_f64();
            let (us1, calls1, _) = redis_counters(&mut side.info).await;
            let cpu = (cpu_ns(side.redis.pid()) - c0) as f64;
            let dec = (l.achieved * el).max(1.0);
            eprintln!(
                "  side by side, latency n={n} {} at {:.0}/s: p50 {} ms p99 {} ms, Redis {:.2} us CPU, {:.2} us in commands /decision, errors {}",
                side.label,
                rate,
                ms(l.p50),
                ms(l.p99),
                cpu / dec / 1e3,
                (us1 - us0) / dec,
                l.errors
            );
            lats.insert(
                (s, n),
                SideLat { redis_cpu_ns: cpu / dec, redis_us: (us1 - us0) / dec, redis_calls: (calls1 - calls0) / dec, l },
            );
        }
    }
    let mut out = vec![
        format!(
            "**Side by side with envoyproxy/ratelimit** (`ENVOY_RATELIMIT_BIN`, built by hand from its source: see \
             \"The side-by-side run\" above). Each on core 1 (`taskset -c 1`; Go's runtime then runs one P, tokio its \
             single-threaded runtime), each on its own redis-server on core 0 with the load generator, both running \
             through the phase, their cells interleaved; no statistics sent by either (`USE_STATSD=false` here, \
             `DISABLE_STATS=true` there: with `USE_STATSD=false` alone it logs every timer). Max: closed loop, \
             {} in flight over {} HTTP/2 connections, {:.0} s a cell; per core-second: 1 / the service's CPU time per \
             decision. Latency: open loop at the same offered load for both, half the slower one's max, {:.0} s a \
             cell. Redis per decision, during those latency cells: redis-server's CPU time (schedstat) and `INFO \
             commandstats` usec and calls (`RL.MULTI` here; `INCRBY` + `EXPIRE` per descriptor there).",
            a.inflight, a.conns, a.max_secs, a.lat_secs
        ),
        String::new(),
        "| descriptors | service | max decisions/s | decisions per core-second | offered/s | p50 ms | p99 ms | Redis CPU µs/decision | Redis µs in commands/decision | Redis calls/decision | errors |".into(),
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|".into(),
    ];
    for &n in &ns {
        for (s, side) in sides.iter().enumerate() {
            let (m, l) = (&maxes[&(s, n)], &lats[&(s, n)]);
            out.push(format!(
                "| {n} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.1} | {} |",
                side.label,
                f0(m.rate),
                f0(1e9 / m.svc_cpu_ns_per_dec),
                f0(rates[&n]),
                ms(l.l.p50),
                ms(l.l.p99),
                l.redis_cpu_ns / 1e3,
                l.redis_us,
                l.redis_calls,
                m.errors + l.l.errors as u64
            ));
        }
    }
    out
}

pub(crate) const SIDE_BEGIN: &str = "<!-- bench-envoy-side:begin -->";
pub(crate) const SIDE_END: &str = "<!-- bench-envoy-side:end -->";

/// Replaces (or appends) the side-by-side section of `path`.
pub(crate) fn write_side_section(path: &Path, a: &Args, started: u64, table: &[String]) {
    let mut body = vec![
        SIDE_BEGIN.to_owned(),
        "## The Envoy service beside envoyproxy/ratelimit (`make bench-envoy` with `ENVOY_RATELIMIT_BIN`)".to_owned(),
        String::new(),
        format!(
            "Run on {} ({}; load average {} at the end). Generated by `make bench-envoy` when `ENVOY_RATELIMIT_BIN` \
             names a binary of envoyproxy/ratelimit (the whole run), or `make bench-envoy ARGS=--side-only` (this \
             phase alone); the differential test of the answers is `tests/service/upstream.rs`, run by `make \
             test-service` with the same variable.",
            utc(started),
            server_version(&a.server),
            loadavg()
        ),
        String::new(),
    ];
    if a.quick {
        body.push("**A --quick run: short cells, numbers only show that the bench works.**".into());
        body.push(String::new());
    }
    body.extend(table.iter().cloned());
    body.push(SIDE_END.to_owned());
    let new = body.join("\n") + "\n";
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let s = match (s.find(SIDE_BEGIN), s.find(SIDE_END)) {
        (Some(x), Some(y)) if x < y => {
            let mut e = y + SIDE_END.len();
            if s[e..].starts_with('\n') {
                e += 1;
            }
            format!("{}{}{}", &s[..x], new, &s[e..])
        }
        _ => format!("{}\n\n{}", s.trim_end_matches('\n'), new),
    };
    std::fs::write(path, s).unwrap();
}
