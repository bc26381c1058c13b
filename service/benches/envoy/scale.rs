//! Phase 7 (issue 43): the service on a 3-primary Redis Cluster, and its
//! local over-limit cache. Three tables, measured in one run:
//!
//! - **cluster scaling**: many users at 1 and then 2 descriptors (their own
//!   and the site's), one at a time: per primary, the keys it holds, the
//!   decisions' calls it served, their µs inside the commands and the
//!   primary's CPU time. The three primaries share this machine's 2 cores,
//!   so decisions per second cannot show the scale-out; the per-node load can.
//! - **across slots**: `--oa-clients` concurrent clients, each request a
//!   50-per-hour descriptor and the site's in another slot: admitted (must
//!   be at most 50), the units left taken by denied requests once the run
//!   ends (must be 0), the refunds, the take → refund window.
//! - **local cache**: an abusive client at `--cache-rate` requests/s (open
//!   loop) against its 10/s limit for `--cache-secs`, with and without
//!   `LOCAL_CACHE_SIZE_IN_BYTES`: Redis calls per second and the admitted
//!   requests against 10 per second spanned.
//!
//! The cluster's servers come from rl_test_support (`REDIS_SERVER`,
//! `RL_MODULE`: main sets them from `--server` and `--module`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use rl_test_support as common;

use crate::{cpu_ns, f0, free_port, now_s, start_redis, start_service_in, Args, Client, Proc, OK};

pub(crate) const SCALE_BEGIN: &str = "<!-- bench-envoy-scale:begin -->";
pub(crate) const SCALE_END: &str = "<!-- bench-envoy-scale:end -->";

const TIGHT: u64 = 50;
const CLIENT_LIMIT: u64 = 10;

fn config() -> String {
    format!(
        "domain: scale\ndescriptors:\n  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: 1000}}\n  \
         - key: site\n    rate_limit: {{unit: hour, requests_per_unit: 1000000000}}\n  \
         - key: tight\n    rate_limit: {{unit: hour, requests_per_unit: {TIGHT}}}\n  \
         - key: client\n    rate_limit: {{unit: second, requests_per_unit: {CLIENT_LIMIT}}}\n"
    )
}

fn request(ds: &[(&str, &str)], hits: Option<u64>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "scale".into(),
        descriptors: ds
            .iter()
            .map(|&(k, v)| RateLimitDescriptor {
                entries: vec![Entry { key: k.into(), value: v.into() }],
                hits_addend: hits.map(|value| UInt64Value { value }),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// A directory with the phase's configuration, for the service's `RUNTIME_ROOT`.
fn config_dir(dir: &Path) -> std::path::PathBuf {
    let d = dir.join("scale");
    std::fs::create_dir_all(d.join("runtime/ratelimit/config")).unwrap();
    std::fs::write(d.join("runtime/ratelimit/config/scale.yaml"), config()).unwrap();
    d
}

async fn client(gport: u16) -> Client {
    RateLimitServiceClient::connect(format!("http://127.0.0.1:{gport}")).await.unwrap()
}

/// One server's (decisions' calls, their µs in the commands, the process's
/// CPU ns): `RL.*`, or the Lua twins' `EVALSHA`/`EVAL`/`FCALL` without the
/// module; failed calls (a first `NOSCRIPT`) are not decisions.
fn load_of(c: &mut redis::Connection) -> (u64, u64, u64) {
    let info: String = redis::cmd("INFO").arg("all").query(c).unwrap();
    let field = |l: &str, f: &str| l.split(f).nth(1)?.split([',', '\r']).next()?.trim().parse::<u64>().ok();
    let (mut calls, mut usec, mut pid) = (0, 0, 0);
    for l in info.lines() {
        let l = l.to_ascii_lowercase();
        if l.starts_with("cmdstat_rl.")
            || ["cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_fcall:"].iter().any(|p| l.starts_with(p))
        {
            calls += field(&l, "calls=").unwrap_or(0).saturating_sub(field(&l, "failed_calls=").unwrap_or(0));
            usec += field(&l, ",usec=").unwrap_or(0);
        }
        if let Some(p) = l.strip_prefix("process_id:") {
            pid = p.trim().parse().unwrap_or(0);
        }
    }
    (calls, usec, cpu_ns(pid as u32))
}

/// The `redis_ratelimit_cross_slot_*` lines of the service's `/metrics`.
async fn metrics(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.lines().filter(|l| l.starts_with("redis_ratelimit_cross_slot")).collect::<Vec<_>>().join("\n")
}

fn metric(m: &str, name: &str) -> String {
    m.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()).unwrap_or("–").to_owned()
}

/// Phase 7's three tables.
pub(crate) async fn scale_phase(a: &Args, dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let sdir = config_dir(dir);
    let nodes = common::start_cluster(3).await;
    let url = format!("127.0.0.1:{},127.0.0.1:{}", nodes[0].port, nodes[1].port);
    let prom = free_port();
    let paddr = format!("127.0.0.1:{prom}");
    let env = [
        ("REDIS_TYPE", "cluster"),
        ("REDIS_URL", url.as_str()),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", paddr.as_str()),
    ];
    let (svc, gport) = start_service_in(a, &sdir, 0, &[], &env);
    out.extend(spread_table(a, &nodes, gport).await);
    out.push(String::new());
    out.extend(cross_slot_table(a, gport, prom).await);
    drop(svc);
    drop(nodes);
    out.push(String::new());
    out.extend(cache_table(a, &sdir).await);
    out
}

async fn spread_table(a: &Args, nodes: &[common::Server], gport: u16) -> Vec<String> {
    let users = a.scale_users;
    let mut c = client(gport).await;
    let mut rows = Vec::new();
    for (label, two) in [("1 (the user's)", false), ("2 (the user's and the site's)", true)] {
        let before: Vec<_> = nodes.iter().map(|n| load_of(&mut n.sync())).collect();
        let keys0: Vec<u64> = nodes.iter().map(|n| redis::cmd("DBSIZE").query(&mut n.sync()).unwrap()).collect();
        let t0 = Instant::now();
        let mut errors = 0;
        for i in 0..users {
            let u = format!("{}u{i}", if two { "b" } else { "a" });
            let ds: Vec<(&str, &str)> = if two { vec![("user", &u), ("site", "")] } else { vec![("user", &u)] };
            match c.should_rate_limit(request(&ds, None)).await {
                Ok(r) if r.get_ref().overall_code == OK => {}
                _ => errors += 1,
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        let mut cells = Vec::new();
        let mut busiest = 0.0f64;
        let total_calls: u64 = nodes.iter().zip(&before).map(|(n, b)| load_of(&mut n.sync()).0 - b.0).sum::<u64>().max(1);
        for ((n, b), k0) in nodes.iter().zip(&before).zip(&keys0) {
            let now = load_of(&mut n.sync());
            let keys: u64 = redis::cmd("DBSIZE").query(&mut n.sync()).unwrap();
            let calls = now.0 - b.0;
            busiest = busiest.max(calls as f64 / total_calls as f64);
            cells.push(format!(
                "{} / {} / {:.1} / {:.0}",
                f0((keys - k0) as f64),
                f0(calls as f64),
                (now.1 - b.1) as f64 / 1e3,
                (now.2 - b.2) as f64 / 1e6
            ));
        }
        rows.push(format!(
            "| {label} | {} | {} | {} | {} | {:.0}% | {} | {errors} |",
            f0(users as f64),
            cells[0],
            cells[1],
            cells[2],
            busiest * 100.0,
            f0(users as f64 / secs)
        ));
    }
    let mut t = vec![
        format!(
            "**Cluster scaling**: a 3-primary Redis Cluster (no replicas) on this machine, the service with \
             `REDIS_TYPE=cluster` and no `hash_tag_key`: {} users one request each, one at a time, at 1 descriptor \
             and then {} other users at 2 (their own and the site's, one key). Per primary: new keys / decisions' \
             calls / ms inside the commands / the primary's CPU ms (schedstat, idle included). All three share 2 \
             cores, so decisions per second cannot show the scale-out; each primary's share of the keys and calls can. \
             The site's one key stays on one primary: a hot key stays hot.",
            f0(a.scale_users as f64),
            f0(a.scale_users as f64)
        ),
        String::new(),
        "| descriptors | requests | primary 1 | primary 2 | primary 3 | busiest primary's share of calls | decisions/s (one at a time) | errors |".into(),
        "|---|---:|---:|---:|---:|---:|---:|---:|".into(),
    ];
    t.extend(rows);
    t
}

async fn cross_slot_table(a: &Args, gport: u16, prom: u16) -> Vec<String> {
    let c = client(gport).await;
    let per = (a.oa_requests / a.oa_clients.max(1)).max(1);
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..a.oa_clients.max(1))
        .map(|_| {
            let mut c = c.clone();
            tokio::spawn(async move {
                let (mut ok, mut err) = (0u64, 0u64);
                for _ in 0..per {
                    match c.should_rate_limit(request(&[("tight", "x"), ("site", "xs")], None)).await {
                        Ok(r) => ok += u64::from(r.get_ref().overall_code == OK),
                        Err(_) => err += 1,
                    }
                }
                (ok, err)
            })
        })
        .collect();
    let (mut admitted, mut errors) = (0, 0);
    for t in tasks {
        let (o, e) = t.await.unwrap();
        admitted += o;
        errors += e;
    }
    let secs = t0.elapsed().as_secs_f64();
    // what each key counts now: checks (hits_addend 0) take nothing
    let left = |k: &'static str, v: &'static str| {
        let mut c = c.clone();
        async move {
            let r = c.should_rate_limit(request(&[(k, v)], Some(0))).await.unwrap();
            u64::from(r.get_ref().statuses[0].limit_remaining)
        }
    };
    let tight_taken = TIGHT - left("tight", "x").await;
    let site_taken = 1_000_000_000 - left("site", "xs").await;
    let m = metrics(prom).await;
    vec![
        format!(
            "**Across slots**: {} concurrent clients × {per} requests, each a `tight` descriptor ({TIGHT} an hour) and \
             the site's, in two slots (each slot group one atomic call, all at once; the groups that took are \
             refunded when another denies). Left taken: what each key counts beyond the admitted requests once the \
             run ends. The window: from the takes sent to the refunds answered (`/metrics`).",
            a.oa_clients
        ),
        String::new(),
        "| requests | admitted (limit 50) | over-admitted | left taken on tight / on the site | refunds | refund failures | take → refund p50 / p99 ms | decisions/s | errors |".into(),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|".into(),
        format!(
            "| {} | {admitted} | {} | {} / {} | {} | {} | {} / {} | {} | {errors} |",
            f0((per * a.oa_clients) as f64),
            admitted.saturating_sub(TIGHT),
            tight_taken.saturating_sub(admitted),
            site_taken.saturating_sub(admitted),
            metric(&m, "redis_ratelimit_cross_slot_refunds "),
            metric(&m, "redis_ratelimit_cross_slot_refund_failures "),
            ms_of(&metric(&m, "redis_ratelimit_cross_slot_refund_window_seconds{quantile=\"0.5\"}")),
            ms_of(&metric(&m, "redis_ratelimit_cross_slot_refund_window_seconds{quantile=\"0.99\"}")),
            f0((per * a.oa_clients) as f64 / secs),
        ),
    ]
}

fn ms_of(seconds: &str) -> String {
    seconds.parse::<f64>().map(|s| format!("{:.2}", s * 1e3)).unwrap_or_else(|_| "–".into())
}

/// One open-loop run of the abusive client against a service: (requests,
/// admitted, seconds spanned, decisions' calls on Redis, elapsed s).
async fn abuse(c: &Client, redis: &mut redis::Connection, who: &str, rate: f64, secs: f64) -> (u64, u64, u64, u64, f64) {
    let n = (rate * secs) as u64;
    let calls0 = load_of(redis).0;
    let s0 = now_s();
    let t0 = tokio::time::Instant::now();
    let who: Arc<str> = who.into();
    let mut tasks = Vec::with_capacity(n as usize);
    for i in 0..n {
        tokio::time::sleep_until(t0 + Duration::from_secs_f64(i as f64 / rate)).await;
        let (mut c, who) = (c.clone(), who.clone());
        tasks.push(tokio::spawn(async move {
            let r = c.should_rate_limit(request(&[("client", &*who), ("site", "")], None)).await;
            matches!(r, Ok(r) if r.get_ref().overall_code == OK)
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += u64::from(t.await.unwrap_or(false));
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let spanned = now_s() - s0 + 1;
    (n, admitted, spanned, load_of(redis).0 - calls0, elapsed)
}

async fn cache_table(a: &Args, sdir: &Path) -> Vec<String> {
    let (redis, rport) = start_redis(a, sdir, false);
    let mut r = redis::Client::open(format!("redis://127.0.0.1:{rport}/")).unwrap().get_connection().unwrap();
    let mut rows = Vec::new();
    for (label, who, env) in [
        ("with `LOCAL_CACHE_SIZE_IN_BYTES=1048576`", "cached", vec![("LOCAL_CACHE_SIZE_IN_BYTES", "1048576")]),
        ("without", "plain", vec![]),
    ] {
        let (svc, gport) = start_service_in(a, sdir, rport, &[], &env);
        let c = client(gport).await;
        let (n, admitted, spanned, calls, elapsed) = abuse(&c, &mut r, who, a.cache_rate, a.cache_secs).await;
        drop(svc);
        rows.push(format!(
            "| {label} | {} | {} | {admitted} | {} | {} | {} | {:.2} |",
            f0(n as f64 / elapsed),
            f0(n as f64),
            CLIENT_LIMIT * spanned,
            admitted.saturating_sub(CLIENT_LIMIT * spanned),
            f0(calls as f64 / elapsed),
            calls as f64 / n as f64
        ));
    }
    drop::<Proc>(redis);
    let mut t = vec![
        format!(
            "**The local over-limit cache**: one abusive client at {} requests/s (open loop, {:.0} s) against its \
             limit of {CLIENT_LIMIT} a second, each request with the site's descriptor too, on one Redis, the \
             service with the cache and then without. At most: {CLIENT_LIMIT} for each second the run spanned.",
            f0(a.cache_rate),
            a.cache_secs
        ),
        String::new(),
        "| service | achieved requests/s | requests | admitted | at most | over-admitted | Redis calls/s | Redis calls per request |".into(),
        "|---|---:|---:|---:|---:|---:|---:|---:|".into(),
    ];
    t.extend(rows);
    t
}

/// Replaces (or appends) the scale section of `path`.
pub(crate) fn write_scale_section(path: &Path, head: &str, table: &[String]) {
    let mut body = vec![SCALE_BEGIN.to_owned(), head.to_owned(), String::new()];
    body.extend(table.iter().cloned());
    body.push(SCALE_END.to_owned());
    let new = body.join("\n") + "\n";
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let s = match (s.find(SCALE_BEGIN), s.find(SCALE_END)) {
        (Some(x), Some(y)) if x < y => {
            let mut e = y + SCALE_END.len();
            if s[e..].starts_with('\n') {
                e += 1;
            }
            format!("{}{}{}", &s[..x], new, &s[e..])
        }
        _ => format!("{}\n\n{}", s.trim_end_matches('\n'), new),
    };
    std::fs::write(path, s).unwrap();
}
