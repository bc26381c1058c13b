//! Strict mode against a real primary and replica: grants the replica
//! acknowledged count; with the replica stopped (SIGSTOP) a grant is a
//! failure (`unreplicated`), decided by the panic limits, never a silent
//! grant, while a denial, a dry run and a refund need no acknowledgement;
//! a leased limiter's unacknowledged lease adds nothing to its reservoir;
//! settings out of range are refused.
use rl_test_support as common;

use common::{wait_until, Server};
use redis_ratelimit_client::*;

const HOUR: u64 = 3_600_000;

fn replica_of(p: &Server, module: bool) -> Server {
    let port = p.port.to_string();
    let r = Server::start_with(module, &["--replicaof", "127.0.0.1", &port]);
    let mut c = r.sync();
    let t0 = std::time::Instant::now();
    loop {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut c).unwrap();
        if info.contains("master_link_status:up") {
            return r;
        }
        assert!(t0.elapsed().as_secs() < 30, "replica link: {info}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn strict_rl<C: Connection>(c: C, backend: Backend) -> RateLimit<C> {
    // WAIT 1 100 inside a 600 ms bound: the server checks WAIT's timeout
    // at its cron (100 ms at hz 10), so it answers within ~200 ms
    let strict = Some(Strict { replicas: 1, wait_ms: Some(100) });
    RateLimit::new(c, Options { timeout_ms: 600, backend, strict, ..Options::default() }).unwrap()
}

#[tokio::test]
async fn grants_count_only_once_a_replica_has_them() {
    for (module, backend) in [(true, Backend::Module), (false, Backend::Lua)] {
        let p = Server::start(module);
        let replica = replica_of(&p, module);
        let rl = strict_rl(p.manager().await, backend);
        let src = if module { Source::Module } else { Source::Lua };
        let lim = rl.limiter(token_bucket("api", 3, 1, HOUR).unwrap(), Panic::Fixed { limit: 10, window_ms: None }).unwrap();
        for left in [2, 1] {
            let d = lim.limit("k", Call::default()).await.unwrap();
            assert_eq!((d.allowed, d.remaining, d.source), (true, left, src), "{d:?}");
        }
        assert_eq!(rl.metrics().unreplicated, 0);

        replica.sigstop();
        // a grant no replica acknowledges: a failure, the panic limit decides
        let d = lim.limit("k", Call::default()).await.unwrap();
        assert_eq!(d.source, Source::Panic, "{d:?}");
        let m = rl.metrics();
        assert_eq!((m.unreplicated, m.failures), (1, 1), "{m:?}");
        // the primary did take the unit (under-, never over-admission):
        // the bucket is empty, and a denial needs no acknowledgement
        let d = lim.limit("k", Call::default()).await.unwrap();
        assert_eq!((d.allowed, d.source), (false, src), "{d:?}");
        // nor a dry run, nor a refund
        let d = lim.limit("k", Call { dry_run: true, ..Call::default() }).await.unwrap();
        assert_eq!(d.source, src);
        assert_eq!(lim.refund("k", 1).await.unwrap().granted, 1);
        let m = rl.metrics();
        assert_eq!((m.unreplicated, m.failures), (1, 1), "{m:?}");

        // an unacknowledged lease adds nothing to the reservoir
        let leased =
            rl.leased(token_bucket("lease", 100, 1, HOUR).unwrap(), Lease { batch: 10, ..Lease::default() }).unwrap();
        let d = leased.limit("l", 1).await.unwrap();
        assert_ne!(d.source, src, "{d:?}");
        assert_eq!(leased.stranded(), 0);
        assert_eq!(rl.metrics().unreplicated, 2);
        replica.sigcont();
        // the replica back: leases count again
        wait_until(10, "a lease the replica acknowledged", || async { leased.limit("l2", 1).await.unwrap().source == src })
            .await;
        assert!(leased.stranded() > 0);
    }
}

#[tokio::test]
async fn strict_settings_out_of_range_are_refused() {
    let s = Server::start(true);
    for (timeout_ms, st) in [
        (50, Strict { replicas: 0, wait_ms: None }),
        (50, Strict { replicas: 1, wait_ms: Some(50) }),
        (50, Strict { replicas: 1, wait_ms: Some(0) }),
        (1, Strict { replicas: 1, wait_ms: None }), // ⌊0.8 × 1⌋ = 0
    ] {
        let r = RateLimit::new(s.multiplexed().await, Options { timeout_ms, strict: Some(st), ..Options::default() });
        assert!(matches!(r, Err(Error::Invalid(_))), "{timeout_ms} {st:?}");
    }
    let ok = RateLimit::new(
        s.multiplexed().await,
        Options { timeout_ms: 50, strict: Some(Strict::default()), ..Options::default() },
    );
    assert!(ok.is_ok());
}
