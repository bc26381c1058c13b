//! The in-flight guard (clients/DESIGN.md, "In-flight limits: the guard"),
//! on the module and on its Lua twin, against real servers: the limit
//! across guards, the release on every exit path (drop, `?`, a panic
//! unwinding in a task, a dropped future, a dropped acquire), the renewal
//! past the lease, a lease the server lost, the id a retried ACQUIRE
//! reuses, and the local in-flight limit while the server is stopped.
//! What each holds is read from the server (an ACQUIRE of COST 0 DRYRUN),
//! polled, never slept on.
use rl_test_support as common;

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use common::{wait_until, Server};
use redis_ratelimit_client::*;

const LUA: &str = include_str!("../../../lua/concurrency.lua");
const LONG: u64 = 600_000;

/// Both backends: a server with the module, and one without (the twin).
const BACKENDS: [(bool, Backend); 2] = [(true, Backend::Module), (false, Backend::Lua)];

/// A bound on each call generous enough for a loaded machine: these tests
/// are about the server's state, not the timeout.
fn opts(backend: Backend) -> Options {
    Options { backend, timeout_ms: 2000, ..Options::default() }
}

/// Units held on `key` now, as the server counts them.
fn held(s: &Server, module: bool, key: &str, limit: u64, lease_ms: u64) -> u64 {
    let mut c = s.sync();
    let args = [
        limit.to_string(),
        lease_ms.to_string(),
        "ACQUIRE".into(),
        "probe".into(),
        "COST".into(),
        "0".into(),
        "DRYRUN".into(),
    ];
    let v: Vec<i64> = if module {
        redis::cmd("RL.CONCURRENCY").arg(key).arg(&args).query(&mut c).unwrap()
    } else {
        redis::cmd("EVAL").arg(LUA).arg(1).arg(key).arg(&args).query(&mut c).unwrap()
    };
    limit - v[2] as u64
}

async fn wait_held(s: &Server, module: bool, key: &str, limit: u64, lease_ms: u64, want: u64, what: &str) {
    wait_until(30, what, || async { held(s, module, key, limit, lease_ms) == want }).await;
}

#[tokio::test]
async fn the_limit_holds_across_guards_and_each_end_releases() {
    for (module, backend) in BACKENDS {
        let s = Server::start(module);
        let rl = RateLimit::new(s.manager().await, opts(backend)).unwrap();
        let inf = rl.inflight(concurrency("jobs", 3, LONG).unwrap(), InFlightOptions::default()).unwrap();
        let k = "rl:{t}:jobs";
        let a = inf.acquire(k, 1).await.unwrap();
        let b = inf.acquire(k, 2).await.unwrap();
        assert!(a.allowed() && b.allowed(), "{backend:?}");
        let want = if module { Source::Module } else { Source::Lua };
        assert_eq!((b.decision().source, b.decision().remaining, b.decision().granted), (want, 0, 2));
        assert_eq!((a.id().len(), a.id().bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))), (32, true));
        assert_ne!(a.id(), b.id(), "an id per hold");
        assert_eq!(held(&s, module, k, 3, LONG), 3);
        let c = inf.acquire(k, 1).await.unwrap();
        assert!(!c.allowed() && c.decision().retry_after_ms > 0 && c.decision().granted == 0, "{:?}", c.decision());
        let m = rl.metrics();
        // a denied guard holds and sends nothing; an in-line release is one call
        drop(c);
        b.release().await.unwrap();
        assert_eq!(held(&s, module, k, 3, LONG), 1, "{backend:?}: released in line");
        assert_eq!(rl.metrics().calls, m.calls + 1, "one RELEASE, nothing for the denied guard");
        // a normal drop releases (on a spawned task)
        drop(a);
        wait_held(&s, module, k, 3, LONG, 0, "a dropped guard released").await;
        let big = inf.acquire(k, 4).await.unwrap();
        assert_eq!(big.decision().retry_after_ms, -1, "more than the limit: never");
        let m = rl.metrics();
        assert_eq!((m.denied, m.decisions_module + m.decisions_lua), (2, 4), "acquires count as decisions: {m:?}");

        // many tasks at once never hold more than the limit, and give all back
        let (now, peak, granted) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (inf, now, peak, granted) = (inf.clone(), now.clone(), peak.clone(), granted.clone());
                tokio::spawn(async move {
                    for _ in 0..20 {
                        let g = inf.acquire(k, 1).await.unwrap();
                        if g.allowed() {
                            peak.fetch_max(now.fetch_add(1, SeqCst) + 1, SeqCst);
                            granted.fetch_add(1, SeqCst);
                            tokio::task::yield_now().await;
                            now.fetch_sub(1, SeqCst);
                            g.release().await.unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert!(peak.load(SeqCst) <= 3 && granted.load(SeqCst) >= 3, "{peak:?} {granted:?}");
        wait_held(&s, module, k, 3, LONG, 0, "every unit back").await;
    }
}

/// Work that fails after its guard is taken: `?` returns early.
async fn work<C: Connection>(inf: &InFlight<C>, key: &str) -> std::result::Result<(), String> {
    let g = inf.acquire(key, 1).await.map_err(|e| e.to_string())?;
    assert!(g.allowed());
    Err::<(), _>("the upstream failed".to_owned())?;
    unreachable!()
}

#[tokio::test]
async fn every_exit_path_releases() {
    for (module, backend) in BACKENDS {
        let s = Server::start(module);
        let rl = RateLimit::new(s.manager().await, opts(backend)).unwrap();
        let inf = rl.inflight(concurrency("one", 1, LONG).unwrap(), InFlightOptions::default()).unwrap();
        let k = "rl:{t}:one";
        let free = |what: &'static str| wait_held(&s, module, k, 1, LONG, 0, what);

        // an early return with `?`
        assert!(work(&inf, k).await.is_err());
        free("released on an early return").await;

        // a panic unwinding inside a task
        let (tx, rx) = tokio::sync::oneshot::channel();
        let i2 = inf.clone();
        let t = tokio::spawn(async move {
            let g = i2.acquire(k, 1).await.unwrap();
            assert!(g.allowed());
            tx.send(()).unwrap();
            panic!("the handler panicked");
        });
        rx.await.unwrap();
        assert!(t.await.unwrap_err().is_panic());
        free("released by a panic unwinding").await;

        // a dropped future: a timeout around the work
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let i2 = inf.clone();
        let work = async move {
            let g = i2.acquire(k, 1).await.unwrap();
            assert!(g.allowed());
            let _ = tx.send(());
            std::future::pending::<()>().await;
        };
        let stream = tokio::spawn(tokio::time::timeout(Duration::from_secs(3600), work));
        rx.await.unwrap();
        assert_eq!(held(&s, module, k, 1, LONG), 1, "held while the work runs");
        assert!(!inf.acquire(k, 1).await.unwrap().allowed(), "{backend:?}: the work holds the only unit");
        stream.abort(); // drops the timeout's future, and the guard inside it
        assert!(stream.await.unwrap_err().is_cancelled());
        free("released when its future was dropped").await;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let i2 = inf.clone();
        let r = tokio::time::timeout(Duration::from_millis(1), async move {
            let _g = i2.acquire(k, 1).await.unwrap();
            let _ = tx.send(());
            std::future::pending::<()>().await;
        })
        .await;
        assert!(r.is_err());
        // the acquire itself may have been cut short: nothing is held either way
        drop(rx);
        free("released when a timeout cut the work").await;
        assert!(inf.acquire(k, 1).await.unwrap().allowed());
    }
}

#[tokio::test]
async fn a_dropped_acquire_releases_what_the_server_took() {
    // the ACQUIRE is written, the server is stopped before it answers, the
    // acquiring future is dropped; once the server reads the ACQUIRE, the
    // RELEASE that follows it frees the unit
    let s = Server::start(true);
    let rl = RateLimit::new(s.manager().await, opts(Backend::Module)).unwrap();
    let inf = rl.inflight(concurrency("one", 1, LONG).unwrap(), InFlightOptions::default()).unwrap();
    let k = "rl:{t}:one";
    assert!(inf.acquire(k, 1).await.unwrap().allowed());
    wait_held(&s, true, k, 1, LONG, 0, "the first guard released").await;
    let before = rl.metrics().calls;
    s.sigstop();
    let i2 = inf.clone();
    let acq = tokio::spawn(async move { i2.acquire(k, 1).await.map(|g| g.allowed()) });
    wait_until(30, "the ACQUIRE sent", || async { rl.metrics().calls > before }).await;
    acq.abort();
    assert!(acq.await.unwrap_err().is_cancelled());
    wait_until(30, "the RELEASE sent", || async { rl.metrics().calls > before + 1 }).await;
    s.sigcont();
    wait_held(&s, true, k, 1, LONG, 0, "the dropped ACQUIRE's unit released").await;
    assert!(inf.acquire(k, 1).await.unwrap().allowed());
}

#[tokio::test]
async fn a_renewed_hold_outlives_its_lease() {
    for (module, backend) in BACKENDS {
        let s = Server::start(module);
        let rl = RateLimit::new(s.manager().await, opts(backend)).unwrap();
        let (lease, renew) = (1500, 50);
        let inf = rl
            .inflight(
                concurrency("long", 1, lease).unwrap(),
                InFlightOptions { renew_ms: Some(renew), ..Default::default() },
            )
            .unwrap();
        let k = "rl:{t}:long";
        let g = inf.acquire(k, 1).await.unwrap();
        // each renewal waits renew_ms after the last: lease / renew of them
        // mean the hold has lived past its lease, kept by them alone
        let n = lease / renew + 2;
        wait_until(60, "renewals past the lease", || async { g.renewals() >= n || g.lost() }).await;
        assert!(!g.lost(), "{backend:?}: the lease lapsed under a renewed hold ({} renewals)", g.renewals());
        assert_eq!(held(&s, module, k, 1, lease), 1, "{backend:?}: still held after {} renewals", g.renewals());
        assert!(!inf.acquire(k, 1).await.unwrap().allowed());
        let m = rl.metrics();
        assert!(m.calls >= n + 2 && m.failures == 0, "RENEWs count as calls: {m:?}");
        drop(g);
        wait_held(&s, module, k, 1, lease, 0, "released").await;
    }
}

#[tokio::test]
async fn a_lease_the_server_lost_is_reported_and_no_longer_renewed() {
    for (module, backend) in BACKENDS {
        let s = Server::start(module);
        let rl = RateLimit::new(s.manager().await, opts(backend)).unwrap();
        let inf = rl
            .inflight(concurrency("lost", 1, LONG).unwrap(), InFlightOptions { renew_ms: Some(20), ..Default::default() })
            .unwrap();
        let k = "rl:{t}:lost";
        let g = inf.acquire(k, 1).await.unwrap();
        wait_until(30, "a first renewal", || async { g.renewals() >= 1 }).await;
        assert!(!g.lost());
        let _: () = redis::cmd("DEL").arg(k).query(&mut s.sync()).unwrap();
        wait_until(30, "lost", || async { g.lost() }).await;
        // the renewal stopped: while another guard renews 10 times at the
        // same pace, the calls grow by its renewals alone (one in flight
        // at most), not twice as fast
        let r = g.renewals();
        let other = inf.acquire("rl:{t}:other", 1).await.unwrap();
        let calls = rl.metrics().calls;
        wait_until(30, "the other guard's renewals", || async { other.renewals() >= 10 }).await;
        let (more, theirs) = (rl.metrics().calls - calls, other.renewals());
        assert!(more <= theirs + 1, "{backend:?}: {more} calls for {theirs} renewals of the other guard");
        assert_eq!(g.renewals(), r);
        assert!(g.lost() && g.allowed(), "the work goes on, no longer counted");
        drop(g);
        drop(other);
        wait_held(&s, module, "rl:{t}:other", 1, LONG, 0, "released").await;
        assert_eq!(held(&s, module, k, 1, LONG), 0);
    }
}

#[tokio::test]
async fn a_retried_acquire_with_the_guards_id_holds_once() {
    for (module, backend) in BACKENDS {
        let s = Server::start(module);
        let rl = RateLimit::new(s.manager().await, opts(backend)).unwrap();
        let inf = rl.inflight(concurrency("jobs", 2, LONG).unwrap(), InFlightOptions::default()).unwrap();
        let k = "rl:{t}:jobs";
        let g = inf.acquire(k, 1).await.unwrap();
        // the client timed out and the same ACQUIRE arrives again
        let args = ["2".to_string(), LONG.to_string(), "ACQUIRE".into(), g.id().to_owned()];
        let mut c = s.sync();
        let v: Vec<i64> = if module {
            redis::cmd("RL.CONCURRENCY").arg(k).arg(&args).query(&mut c).unwrap()
        } else {
            redis::cmd("EVAL").arg(LUA).arg(1).arg(k).arg(&args).query(&mut c).unwrap()
        };
        assert_eq!((v[0], v[2]), (1, 1), "{backend:?}: renewed, not held twice");
        let other = inf.acquire(k, 1).await.unwrap();
        assert!(other.allowed());
        g.release().await.unwrap();
        assert_eq!(held(&s, module, k, 2, LONG), 1, "{backend:?}: the guard's RELEASE freed its one hold");
        drop(other);
        wait_held(&s, module, k, 2, LONG, 0, "released").await;
    }
}

#[tokio::test]
async fn breaker_open_holds_are_local_bounded_and_leave_nothing() {
    for (module, backend) in BACKENDS {
        let s = Server::start(module);
        let o = Options {
            backend,
            timeout_ms: 100,
            breaker: Breaker { failures: 1, open_ms: 300.0, ..Breaker::default() },
            ..Options::default()
        };
        let rl = RateLimit::new(s.manager().await, o).unwrap();
        let panic = Panic::Fixed { limit: 2, window_ms: None };
        let inf =
            rl.inflight(concurrency("jobs", 10, LONG).unwrap(), InFlightOptions { panic, ..Default::default() }).unwrap();
        let k = "rl:{t}:jobs";
        let remote = inf.acquire(k, 1).await.unwrap();
        assert!(matches!(remote.decision().source, Source::Module | Source::Lua));
        s.sigstop();
        let a = inf.acquire(k, 1).await.unwrap();
        let b = inf.acquire(k, 1).await.unwrap();
        let c = inf.acquire(k, 1).await.unwrap();
        let big = inf.acquire(k, 3).await.unwrap();
        let d = |g: &Guard<_>| (g.allowed(), g.decision().source, g.decision().retry_after_ms);
        assert_eq!(
            [d(&a), d(&b), d(&c), d(&big)],
            [(true, Source::Panic, 0), (true, Source::Panic, 0), (false, Source::Panic, 1), (false, Source::Panic, -1)]
        );
        assert_eq!((inf.held_locally(k), b.decision().limit, b.decision().remaining), (2, 2, 0));
        assert!(rl.metrics().decisions_panic >= 4 && rl.metrics().trips >= 1, "{:?}", rl.metrics());
        drop((a, c, big));
        assert_eq!(inf.held_locally(k), 1, "a local hold given back at once");
        s.sigcont();
        // Redis back: the breaker probes, holds go to the server again
        let t0 = std::time::Instant::now();
        let back = loop {
            let g = inf.acquire(k, 1).await.unwrap();
            if g.decision().source != Source::Panic {
                break g;
            }
            drop(g);
            assert!(t0.elapsed() < Duration::from_secs(60), "no server hold 60 s after SIGCONT: {:?}", rl.metrics());
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(inf.held_locally(k), 1, "b stays local until it ends");
        drop(b);
        assert_eq!(inf.held_locally(k), 0);
        // nothing leaked: the stalled ACQUIREs were each followed by a RELEASE
        wait_held(&s, module, k, 10, LONG, 2, "the remote guard and the one after the outage").await;
        remote.release().await.unwrap();
        drop(back);
        wait_held(&s, module, k, 10, LONG, 0, "nothing held after the outage").await;
        assert_eq!(held(&s, module, k, 10, LONG), 0);
    }
}

#[tokio::test]
async fn a_concurrency_policy_only_goes_to_inflight() {
    {
        let s = Server::start(true);
        let rl = RateLimit::new(s.manager().await, Options::default()).unwrap();
        let c = concurrency("c", 2, 1000).unwrap();
        assert!(matches!(rl.limiter(c.clone(), Panic::default()), Err(Error::Invalid(_))));
        assert!(matches!(rl.leased(c.clone(), Lease::default()), Err(Error::Invalid(_))));
        assert!(all_of(vec![c.clone()], Some("x")).is_err());
        assert!(rl.inflight(token_bucket("t", 1, 1, 1).unwrap(), InFlightOptions::default()).is_err());
        for bad in [0, 1000, 5000] {
            assert!(rl.inflight(c.clone(), InFlightOptions { renew_ms: Some(bad), ..Default::default() }).is_err(), "{bad}");
        }
        assert!(rl.inflight(c.clone(), InFlightOptions { renew_ms: Some(999), ..Default::default() }).is_ok());
        let inf = rl.inflight(c, InFlightOptions::default()).unwrap();
        assert!(matches!(inf.acquire("k", 0).await, Err(Error::Invalid(_))));
    }
}

#[tokio::test]
async fn a_forgotten_guard_lapses_within_its_lease_once_its_runtime_stops() {
    // `mem::forget` is a guard never dropped: it renews while its runtime
    // runs; once that stops (a process ending), the lease lapses by itself
    for (module, backend) in BACKENDS {
        let s = Server::start(module);
        let (lease, url) = (3000, s.url());
        let forgot = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let conn = redis::Client::open(url).unwrap().get_connection_manager().await.unwrap();
                let rl = RateLimit::new(conn, opts(backend)).unwrap();
                let inf = rl
                    .inflight(
                        concurrency("f", 1, lease).unwrap(),
                        InFlightOptions { renew_ms: Some(30), ..Default::default() },
                    )
                    .unwrap();
                let g = inf.acquire("rl:{t}:f", 1).await.unwrap();
                assert!(g.allowed());
                wait_until(30, "renewals", || async { g.renewals() >= 3 }).await;
                std::mem::forget(g);
            });
        });
        forgot.join().unwrap();
        assert_eq!(held(&s, module, "rl:{t}:f", 1, lease), 1, "{backend:?}: nothing released it");
        wait_held(&s, module, "rl:{t}:f", 1, lease, 0, "the forgotten guard's lease lapsed").await;
    }
}

#[tokio::test]
async fn a_failed_renewal_counts_as_a_failure_and_is_tried_again() {
    let s = Server::start(true);
    let o = Options { timeout_ms: 100, breaker: Breaker { failures: 1000, ..Breaker::default() }, ..Options::default() };
    let rl = RateLimit::new(s.manager().await, o).unwrap();
    let renew = InFlightOptions { renew_ms: Some(20), ..Default::default() };
    let inf = rl.inflight(concurrency("r", 1, LONG).unwrap(), renew).unwrap();
    let g = inf.acquire("rl:{t}:r", 1).await.unwrap();
    assert_eq!(g.decision().source, Source::Module);
    s.sigstop();
    wait_until(30, "two RENEWs failed", || async { rl.metrics().failures >= 2 }).await;
    s.sigcont();
    let n = g.renewals();
    wait_until(30, "renewals again", || async { g.renewals() >= n + 3 }).await;
    assert!(!g.lost(), "the lease outlived the outage");
    g.release().await.unwrap();
    assert_eq!(held(&s, true, "rl:{t}:r", 1, LONG), 0);
}
