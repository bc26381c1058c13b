//! SentinelConnection against real sentinels: a module-loaded primary and
//! replica watched by three sentinels; the primary is killed (or stopped
//! with SIGSTOP), the
//! sentinels promote the replica, and the limiter follows: every decision
//! within the timeout (the panic limits decide meanwhile), then decisions
//! from the promoted replica again, going on from the replicated state.
use rl_test_support as common;

use std::time::{Duration, Instant};

use common::{role, Sentinel, Server};
use redis_ratelimit_client::*;

const HOUR: u64 = 3_600_000;
const TIMEOUT_MS: u64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limiter_follows_a_failover_from_a_killed_primary() {
    failover(false).await;
}

/// A stopped primary (SIGSTOP) answers nothing and closes nothing: the
/// calls the timeout abandons make the connection ask the sentinels again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limiter_follows_a_failover_from_a_stopped_primary() {
    failover(true).await;
}

async fn failover(stop: bool) {
    let mut primary = Server::start(true);
    let replica = Server::start_with(true, &["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let sentinels = Sentinel::start_three(primary.port).await;

    let urls: Vec<String> = sentinels.iter().map(Sentinel::url).collect();
    let conn = SentinelConnection::new(&urls, "mymaster").unwrap();
    let rl = RateLimit::new(conn, Options { timeout_ms: TIMEOUT_MS, ..Options::default() }).unwrap();
    let lim =
        rl.limiter(token_bucket("api", 1000, 1, HOUR).unwrap(), Panic::Fixed { limit: 100_000, window_ms: None }).unwrap();
    // ten grants by Redis (on a loaded machine a first call, which finds
    // the primary through the sentinels, may outlast the timeout: the panic
    // limits decide it, and Redis counts nothing)
    let (mut granted, t0) = (0, Instant::now());
    while granted < 10 {
        let d = lim.limit("k", Call::default()).await.unwrap();
        assert!(d.allowed, "{d:?}");
        granted += usize::from(d.source == Source::Module);
        assert!(t0.elapsed() < Duration::from_secs(30), "Redis did not answer within 30 s");
    }
    // every grant on the replica before the kill
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut primary.sync()).unwrap();
    assert_eq!(acked, 1);

    if stop {
        primary.sigstop();
    } else {
        primary.kill();
    }
    let t0 = Instant::now();
    let (mut worst, mut panics) = (Duration::ZERO, 0);
    let after = loop {
        let t = Instant::now();
        let d = lim.limit("k", Call::default()).await.unwrap();
        worst = worst.max(t.elapsed());
        if d.source == Source::Module {
            break d;
        }
        assert_eq!(d.source, Source::Panic, "{d:?}");
        panics += 1;
        assert!(t0.elapsed() < Duration::from_secs(60), "no failover within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "{}: failover followed after {:.1} s: {panics} panic decisions, slowest decision {} ms",
        if stop { "SIGSTOP" } else { "SIGKILL" },
        t0.elapsed().as_secs_f64(),
        worst.as_millis()
    );
    // the bound the library promises: no second wait, so every decision
    // under two timeouts (outage.rs says why not "timeout + 20 ms")
    assert!(worst < Duration::from_millis(2 * TIMEOUT_MS), "slowest decision {worst:?}");
    assert!(panics > 0, "the kill was seen");
    assert_eq!(role(&replica), "master");
    // the promoted replica goes on from the replicated state: 10 before, this one
    assert_eq!((after.allowed, after.remaining), (true, 1000 - 11), "{after:?}");
}
