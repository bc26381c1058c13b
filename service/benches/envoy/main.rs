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
//! 6. **side by side**, when `ENVOY_RATELIMIT_BIN` names a binary of
//!    envoyproxy/ratelimit (built by hand; `side.rs`): both services' max
//!    decisions/s and per core-second, p50/p99 at the same offered load, and
//!    Redis's time per decision; `--side-only` runs this phase alone.
//!
//! 7. **scale** (issue 43; `scale.rs`): a 3-primary cluster (the keys and
//!    calls per primary, a request across slots under concurrency) and the
//!    local over-limit cache against an abusive client; `--scale-only` runs
//!    this phase alone.
//!
//! `--count-only N` runs none of these but the service under callgrind: its
//! instructions and heap allocations per decision (see `count_only`).
//!
//! Arguments (`--name value`; `make bench-envoy ARGS="..."`): see `usage()`.
//!
//! What the phases share is here; each phase is a module.

mod admission;
mod args;
mod callgrind;
mod load;
mod procs;
mod redis_time;
mod report;
mod scale;
mod side;
mod workload;

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

use admission::*;
use args::*;
use callgrind::*;
use load::*;
use procs::*;
use redis_time::*;
use report::*;
use scale::*;
use side::*;
use workload::*;

const OK: i32 = 1;

/// The first failed request of a run is printed (the counts are in the table).
static FIRST_ERROR: AtomicBool = AtomicBool::new(true);

type Client = RateLimitServiceClient<Channel>;
type Conn = redis::aio::MultiplexedConnection;

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
    // the cluster of phase 7 starts its servers as the suites do (rl_test_support)
    std::env::set_var("REDIS_SERVER", &a.server);
    std::env::set_var("RL_MODULE", &a.module);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    if a.scale_only {
        let out = rt.block_on(scale_phase(&a, &dir));
        for l in &out {
            println!("{l}");
        }
        if let Some(path) = &a.write {
            write_scale_section(path, &scale_head(&a, started), &out);
            eprintln!("wrote the scale section of {}", path.display());
        }
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    if a.count_only > 0 {
        // the dumps stay, for callgrind_annotate
        rt.block_on(count_only(&a, &dir));
        return;
    }
    if a.side_only {
        let bin = a.envoy_bin.clone().expect("--side-only needs ENVOY_RATELIMIT_BIN (or --envoy-ratelimit PATH)");
        let out = rt.block_on(side_by_side(&a, &dir, &bin));
        for l in &out {
            println!("{l}");
        }
        if let Some(path) = &a.write {
            write_side_section(path, &a, started, &out);
            eprintln!("wrote the side-by-side section of {}", path.display());
        }
        let _ = std::fs::remove_dir_all(&dir);
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
    // 6. envoyproxy/ratelimit itself beside the service, when its binary is named
    let side = a.envoy_bin.as_ref().map(|bin| rt.block_on(side_by_side(&a, &dir, bin)));
    // 7. a cluster and the local cache
    let scale = rt.block_on(scale_phase(&a, &dir));
    match &a.write {
        Some(path) => write_scale_section(path, &scale_head(&a, started), &scale),
        None => scale.iter().for_each(|l| println!("{l}")),
    }
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(path) = &a.write {
        write_section(path, &a, &out);
        eprintln!("wrote the bench-envoy section of {}", path.display());
    }
    match (&side, &a.write) {
        (Some(t), Some(path)) => write_side_section(path, &a, started, t),
        (Some(t), None) => t.iter().for_each(|l| println!("{l}")),
        (None, _) => eprintln!("no side-by-side phase: ENVOY_RATELIMIT_BIN is not set"),
    }
}

/// The scale section's title and run line.
fn scale_head(a: &Args, started: u64) -> String {
    format!(
        "## The Envoy service on a cluster, and its local cache (`make bench-envoy`)\n\nRun on {} ({}; load average {} \
         at the end). Generated by `make bench-envoy` (the whole run) or `make bench-envoy ARGS=--scale-only` (this \
         phase alone); tests/service/spread.rs and cache.rs assert the same properties.{}",
        utc(started),
        server_version(&a.server),
        loadavg(),
        if a.quick { "\n\n**A --quick run: short cells, numbers only show that the bench works.**" } else { "" }
    )
}
