//! The time of one local (leased) decision: `LeasedLimiter::limit` answered
//! from the reservoir, no I/O. The reservoir is filled once from a real
//! server (REDIS_SERVER, RL_MODULE) with a lease that never runs out, so
//! every measured decision is local; iter_custom times a loop of awaited
//! decisions inside one runtime (no block_on per decision).
use rl_test_support as common;

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use redis_ratelimit_client::*;

fn local_decision(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let s = common::Server::start(true);
    let lim = rt.block_on(async {
        let rl = RateLimit::new(s.manager().await, Options::default()).unwrap();
        let p = token_bucket("bench", MAX, 1, 1000).unwrap();
        let lim = rl.leased(p, Lease { batch: 1 << 40, low_water: 0.0, ..Lease::default() }).unwrap();
        let d = lim.limit("k", 1).await.unwrap();
        assert!(d.allowed && d.source == Source::Module);
        lim
    });
    c.bench_function("leased local decision", |b| {
        b.iter_custom(|n| {
            rt.block_on(async {
                let t0 = Instant::now();
                for _ in 0..n {
                    let d = lim.limit("k", 1).await.unwrap();
                    debug_assert_eq!(d.source, Source::Local);
                    std::hint::black_box(d);
                }
                t0.elapsed()
            })
        })
    });
    let d = rt.block_on(lim.limit("k", 1)).unwrap();
    assert_eq!(d.source, Source::Local, "every measured decision was local");
    drop(s);
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = local_decision
}
criterion_main!(benches);
