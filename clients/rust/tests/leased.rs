//! Leased limiters against a real server: local decisions between leases,
//! one lease for concurrent callers on a new key, refunds on idle, on
//! eviction and on close, exact conservation across three instances
//! sharing one bucket, and the reservoir spent first in an outage.
mod common;

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
            let mut granted = 0;
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_millis(600) {
                let d = lim.limit("shared", 1 + (granted % 3)).await.unwrap();
                granted += d.granted;
                if granted % 5 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            assert_eq!(granted, lim.granted());
            let left = lim.stranded();
            let back = lim.close().await.unwrap();
            assert_eq!(back, left);
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
