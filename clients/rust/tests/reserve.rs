//! Reserve, then settle (clients/DESIGN.md, "Reservations"), on the module
//! and on its Lua twin: the unused part of an estimate comes back (REFUND),
//! an overrun is taken past the limit (COST n FORCE) and denies the next
//! call until the debt is repaid; a denied reservation settles to nothing.
use rl_test_support as common;

use common::Server;
use redis_ratelimit_client::*;

const LONG: u64 = 1_000_000_000_000;

#[tokio::test]
async fn settle_gives_back_or_takes_the_difference_once() {
    for (module, backend) in [(true, Backend::Module), (false, Backend::Lua)] {
        let s = Server::start(module);
        let rl = RateLimit::new(s.manager().await, Options { backend, timeout_ms: 2000, ..Options::default() }).unwrap();
        let lim = rl.limiter(fixed_window("tpm", 1000, LONG, false).unwrap(), Panic::default()).unwrap();
        let left = |d: &Decision| d.remaining;
        // 600 reserved, 100 used: 500 back
        let r = lim.reserve("k", 600).await.unwrap();
        assert!(r.allowed() && left(r.decision()) == 400);
        let d = r.settle(100).await.unwrap().unwrap();
        assert_eq!(left(&d), 900, "{backend:?}");
        // 300 reserved and used: nothing sent
        let r = lim.reserve("k", 300).await.unwrap();
        assert!(r.settle(300).await.unwrap().is_none());
        // 500 reserved, 1,100 used: 600 past it, a debt of 500
        let r = lim.reserve("k", 500).await.unwrap();
        assert!(r.allowed());
        let d = r.settle(1100).await.unwrap().unwrap();
        assert!(d.allowed && d.granted == 600 && d.remaining == 0, "{d:?}");
        let next = lim.limit("k", Call::default()).await.unwrap();
        assert!(!next.allowed, "{backend:?}: in debt");
        // denied: settles to nothing
        let r = lim.reserve("k", 10).await.unwrap();
        assert!(!r.allowed() && r.settle(0).await.unwrap().is_none());
        // the debt is repaid first: 500 back leaves the window exactly full
        assert_eq!(lim.refund("k", 500).await.unwrap().remaining, 0);
        assert_eq!(lim.refund("k", 1).await.unwrap().remaining, 1);
        assert!(lim.limit("k", Call { force: true, partial: true, ..Call::default() }).await.is_err());
    }
}
