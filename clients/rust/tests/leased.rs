//! Leased limiters against a real server: local decisions between leases,
//! one lease for concurrent callers on a new key, refunds on idle, on
//! eviction and on close, exact conservation across three instances
//! sharing one bucket, and the reservoir spent first in an outage.
use rl_test_support as common;

use std::time::{Duration, Instant};

use common::{wait_until, Server};
use redis_ratelimit_client::*;

const HOUR: u64 = 3_600_000;

fn rl<C: Connection>(c: C, timeout_ms: u64) -> RateLimit<C> {
    RateLimit::new(c, Options { timeout_ms, ..Options::default() }).unwrap()
}

/// The shared bucket's whole tokens, read without taking any (COST 0).
fn shared_left(s: &Server, key: &str, cap: u64) -> u64 {
    let v: Vec<i64> =
        redis::cmd("RL.TOKENBUCKET").arg(key).arg(cap).arg(1).arg(HOUR).arg("COST").arg(0).query(&mut s.sync()).unwrap();
    v[2] as u64
}

#[tokio::test]
async fn local_decisions_between_leases() {
    let s = Server::start(true);
    let r = rl(s.manager().await, 1000);
    let lim = r.leased(token_bucket("api", 1000, 1, HOUR).unwrap(), Lease { batch: 10, ..Lease::default() }).unwrap();
    let first = lim.limit("k", 1).await.unwrap();
    assert_eq!((first.source, first.remaining), (Source::Module, 999), "{first:?}");
    let mut local = 0;
    for _ in 0..24 {
        let d = lim.limit("k", 1).await.unwrap();
        assert!(d.allowed);
        local += usize::from(d.source == Source::Local);
        tokio::task::yield_now().await;
    }
    wait_until(5, "the refills", || async { r.metrics().leases == 3 && lim.stranded() == 5 }).await;
    assert!(local >= 22, "{local} local decisions of 24");
    let m = r.metrics();
    assert_eq!((m.leases, m.lease_tokens), (3, 30), "{m:?}");
    assert_eq!(shared_left(&s, "k", 1000), 970);
    assert_eq!(lim.close().await.unwrap(), 5);
    assert_eq!(shared_left(&s, "k", 1000), 975);
    assert_eq!(lim.stranded(), 0);
}

#[tokio::test]
async fn four_callers_on_a_new_key_share_one_lease() {
    let s = Server::start(true);
    let r = rl(s.manager().await, 1000);
    let lim = r
        .leased(token_bucket("api", 100, 1, HOUR).unwrap(), Lease { batch: 2, low_water: 0.0, ..Lease::default() })
        .unwrap();
    let (a, b, c, d) = tokio::join!(lim.limit("k", 1), lim.limit("k", 1), lim.limit("k", 1), lim.limit("k", 1));
    let all = [a.unwrap(), b.unwrap(), c.unwrap(), d.unwrap()];
    assert_eq!(all.iter().filter(|d| d.allowed).count(), 2, "{all:?}");
    for d in all.iter().filter(|d| !d.allowed) {
        assert_eq!((d.retry_after_ms, d.source), (1, Source::Local), "{d:?}");
    }
    let m = r.metrics();
    assert_eq!((m.leases, m.lease_waits), (1, 3), "{m:?}");
    // the next caller, with no lease in flight, takes one again
    assert!(lim.limit("k", 1).await.unwrap().allowed);
    assert_eq!(r.metrics().leases, 2);
}

#[tokio::test]
async fn idle_and_evicted_keys_give_their_units_back() {
    let s = Server::start(true);
    let r = rl(s.manager().await, 1000);
    let opts = Lease { batch: 10, max_keys: 2, idle_ms: 150, ..Lease::default() };
    let lim = r.leased(token_bucket("api", 100, 1, HOUR).unwrap(), opts).unwrap();
    for k in ["a", "b", "c"] {
        assert!(lim.limit(k, 1).await.unwrap().allowed);
    }
    // "a" was evicted by "c": its 9 units went back
    wait_until(5, "the eviction's refund", || async { shared_left(&s, "a", 100) == 99 }).await;
    assert_eq!(lim.stranded(), 18);
    wait_until(5, "the idle refunds", || async { lim.stranded() == 0 && r.metrics().refunds == 3 }).await;
    assert_eq!((shared_left(&s, "b", 100), shared_left(&s, "c", 100)), (99, 99));
    assert_eq!(r.metrics().refund_tokens, 27);
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Decisions of 1-3 units on the shared key until `done`, then `close()`:
/// the units granted (checked against the limiter's own count, and every
/// unit held given back).
async fn lease_until<C: Connection>(lim: &LeasedLimiter<C>, done: impl Fn() -> bool) -> u64 {
    let mut granted = 0;
    while !done() {
        let d = lim.limit("shared", 1 + (granted % 3)).await.unwrap();
        granted += d.granted;
        if granted % 5 == 0 {
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(granted, lim.granted());
    let left = lim.stranded();
    assert_eq!(lim.close().await.unwrap(), left);
    granted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn exact_conservation_across_three_instances() {
    let s = Server::start(true);
    const CAP: u64 = 500;
    let mut tasks = vec![];
    for i in 0..3u64 {
        let r = rl(s.manager().await, 1000);
        let lim =
            r.leased(token_bucket("api", CAP, 1, HOUR).unwrap(), Lease { batch: 7 + i * 6, ..Lease::default() }).unwrap();
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            let granted = lease_until(&lim, || t0.elapsed() >= Duration::from_millis(600)).await;
            let m = r.metrics();
            // what this instance leased = what it granted + what it gave back
            assert_eq!(m.lease_tokens, granted + m.refund_tokens, "{m:?}");
            granted
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    println!("3 instances granted {total} of {CAP}");
    assert!(total > CAP / 2, "the instances ran: {total}");
    assert_eq!(shared_left(&s, "shared", CAP), CAP - total, "the server's bucket = capacity − granted");
}

/// One of the processes of `exact_conservation_across_three_processes`: a
/// no-op unless `RL_CONSERVE_URL` is set (the parent runs this test binary
/// again with it). Leases from the shared bucket until `RL_CONSERVE_UNTIL`
/// (UNIX ms), closes, and prints what it granted, leased and gave back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conservation_worker() {
    let Ok(url) = std::env::var("RL_CONSERVE_URL") else { return };
    let env = |k: &str| std::env::var(k).unwrap().parse::<u64>().unwrap();
    let (batch, until, cap) = (env("RL_CONSERVE_BATCH"), env("RL_CONSERVE_UNTIL"), env("RL_CONSERVE_CAP"));
    let conn = redis::aio::ConnectionManager::new(redis::Client::open(url).unwrap()).await.unwrap();
    let r = rl(conn, 1000);
    let lim = r.leased(token_bucket("api", cap, 1, HOUR).unwrap(), Lease { batch, ..Lease::default() }).unwrap();
    let granted = lease_until(&lim, || unix_ms() >= until).await;
    let m = r.metrics();
    println!("RL_CONSERVE granted={granted} leased={} refunded={} leases={}", m.lease_tokens, m.refund_tokens, m.leases);
}

/// Three processes (this test binary again, `conservation_worker`), each
/// with its own connection and batch, share one bucket for 1.5 s: each
/// leased exactly what it granted plus what it gave back, and the server's
/// bucket ends at capacity − what the three granted.
#[test]
fn exact_conservation_across_three_processes() {
    const CAP: u64 = 600;
    let s = Server::start(true);
    let exe = std::env::current_exe().unwrap();
    let until = unix_ms() + 1500;
    let children: Vec<_> = [7u64, 13, 19]
        .iter()
        .map(|batch| {
            std::process::Command::new(&exe)
                .args(["--exact", "conservation_worker", "--nocapture", "--test-threads=1"])
                .env("RL_CONSERVE_URL", s.url())
                .env("RL_CONSERVE_BATCH", batch.to_string())
                .env("RL_CONSERVE_UNTIL", until.to_string())
                .env("RL_CONSERVE_CAP", CAP.to_string())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut total = 0;
    let mut pids = std::collections::BTreeSet::new();
    for c in children {
        pids.insert(c.id());
        let out = c.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "worker failed: {text}");
        let at = text.find("RL_CONSERVE ").unwrap_or_else(|| panic!("no figures: {text}"));
        let line = text[at..].lines().next().unwrap();
        let field = |k: &str| -> u64 {
            line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{k}="))).unwrap().parse().unwrap()
        };
        let (granted, leased, refunded) = (field("granted"), field("leased"), field("refunded"));
        assert_eq!(leased, granted + refunded, "{line}");
        assert!(field("leases") > 0, "every process leased: {line}");
        println!("{line}");
        total += granted;
    }
    assert_eq!(pids.len(), 3);
    println!("3 processes granted {total} of {CAP}");
    assert!(total > CAP / 2, "the processes ran: {total}");
    assert_eq!(shared_left(&s, "shared", CAP), CAP - total, "the server's bucket = capacity − granted");
}

/// Redis calls per decision of a leased limiter at batch 10, 50 and 200:
/// one lease per batch of units (2,000 decisions of 1 on one key).
#[tokio::test]
async fn calls_per_decision_by_batch() {
    let s = Server::start(true);
    for batch in [10u64, 50, 200] {
        let r = rl(s.manager().await, 1000);
        let lim = r.leased(token_bucket("api", 1_000_000, 1, HOUR).unwrap(), Lease { batch, ..Lease::default() }).unwrap();
        let key = format!("b{batch}");
        lim.limit(&key, 1).await.unwrap(); // the first lease
        let before = r.metrics().calls;
        const N: u64 = 2000;
        for _ in 0..N {
            assert!(lim.limit(&key, 1).await.unwrap().allowed);
            tokio::task::yield_now().await;
        }
        // (a background refill may still be in flight: counted, within the bound)
        let calls = r.metrics().calls - before;
        println!("batch {batch}: {calls} calls for {N} decisions (1/{:.0})", N as f64 / calls as f64);
        // each lease brings at most `batch` units, and no more leases than needed
        assert!(calls >= N / batch - 1 && calls <= N / batch + 1, "batch {batch}: {calls} calls");
        lim.close().await.unwrap();
    }
}

#[tokio::test]
async fn an_outage_spends_the_reservoir_then_the_panic_limits() {
    let s = Server::start(true);
    let r = RateLimit::new(
        s.manager().await,
        Options {
            timeout_ms: 20,
            breaker: Breaker { failures: 1, open_ms: 60_000.0, ..Breaker::default() },
            ..Options::default()
        },
    )
    .unwrap();
    let opts =
        Lease { batch: 10, low_water: 0.0, panic: Panic::Fixed { limit: 3, window_ms: Some(HOUR) }, ..Lease::default() };
    let lim = r.leased(token_bucket("api", 100, 1, HOUR).unwrap(), opts).unwrap();
    assert!(lim.limit("k", 1).await.unwrap().allowed);
    s.sigstop();
    let mut sources = vec![];
    for _ in 0..15 {
        let t0 = Instant::now();
        let d = lim.limit("k", 1).await.unwrap();
        assert!(t0.elapsed() < Duration::from_millis(20 + 20));
        sources.push((d.source, d.allowed));
    }
    s.sigcont();
    let local = sources.iter().filter(|x| **x == (Source::Local, true)).count();
    let panic_ok = sources.iter().filter(|x| **x == (Source::Panic, true)).count();
    assert_eq!((local, panic_ok), (9, 3), "{sources:?}");
    assert_eq!(sources.len() - local - panic_ok, 3);
    assert_eq!(r.metrics().trips, 1);
}
