//! Envoy's `is_negative_hits` (issue 46, item 4): a descriptor whose hits
//! are given back (`REFUND`, never below zero), always answered `OK` with
//! what is left after it. With it Envoy users build in-flight limits: a
//! hit when a stream starts, a negative hit when it ends. Here an in-flight
//! limit of 3 on every algorithm the service has, one request at a time and
//! under 24 concurrent streams; and the local over-limit cache forgets a
//! key given units back. The limits are per hour (token bucket: one token
//! an hour), each scenario in one hour window.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use crate::support::*;

const INFLIGHT: &str = r#"
domain: streams
descriptors:
  - key: fw
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: tb
    rate_limit: {algorithm: token_bucket, unit: hour, requests_per_unit: 1, burst: 3}
  - key: sl
    rate_limit: {algorithm: sliding_log, unit: hour, requests_per_unit: 3}
  - key: sc
    rate_limit: {algorithm: sliding_counter, unit: hour, requests_per_unit: 3}
"#;

const KINDS: [&str; 4] = ["fw", "tb", "sl", "sc"];

fn start(kind: &str, user: &str) -> RateLimitRequest {
    req("streams", vec![desc(&[(kind, user)])])
}

fn end(kind: &str, user: &str, n: u64) -> RateLimitRequest {
    let mut d = desc(&[(kind, user)]);
    d.is_negative_hits = true;
    d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: n });
    req("streams", vec![d])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_limit_of_three_on_every_algorithm() {
    in_one_window(HOUR_MS, || async {
        let e = Env::start("negative", INFLIGHT, &[]).await;
        for kind in KINDS {
            let ask = |r| e.ask(r);
            // three streams start; the fourth is over
            for left in [2, 1, 0] {
                let a = ask(start(kind, "u")).await;
                assert_eq!((a.overall_code, rem(&a.statuses[0])), (OK, (OK, left)), "{kind}");
            }
            assert_eq!(ask(start(kind, "u")).await.overall_code, OVER, "{kind}: a fourth in flight");
            // one ends: OK, one free, and one more may start, not two
            let a = ask(end(kind, "u", 1)).await;
            assert_eq!((a.overall_code, rem(&a.statuses[0])), (OK, (OK, 1)), "{kind}: a refund answers what is left");
            assert_eq!(ask(start(kind, "u")).await.overall_code, OK, "{kind}");
            assert_eq!(ask(start(kind, "u")).await.overall_code, OVER, "{kind}");
            // more given back than held: never below zero, so still three at most
            let a = ask(end(kind, "u", 5)).await;
            assert_eq!(rem(&a.statuses[0]), (OK, 3), "{kind}: floored at the limit");
            for _ in 0..3 {
                assert_eq!(ask(start(kind, "u")).await.overall_code, OK, "{kind}");
            }
            assert_eq!(ask(start(kind, "u")).await.overall_code, OVER, "{kind}: the over-refund made no room");
            // a refund on a key never taken: OK, the whole limit, no debt
            let a = ask(end(kind, "fresh", 2)).await;
            assert_eq!((a.overall_code, rem(&a.statuses[0])), (OK, (OK, 3)), "{kind}");
            // a refund beside a take in one request: given back first
            let mut both = end(kind, "u", 1);
            both.descriptors.push(desc(&[(kind, "u")]));
            let a = ask(both).await;
            assert_eq!(a.overall_code, OK, "{kind}: the refund made room for the take");
            assert_eq!(rem(&a.statuses[1]), (OK, 0), "{kind}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_three_streams_at_once() {
    in_one_window(HOUR_MS, || async {
        let e = Arc::new(Env::start("negative-load", INFLIGHT, &[]).await);
        for kind in KINDS {
            // what the test holds: incremented after a grant, decremented before
            // the refund is sent, so it never exceeds what the service holds
            let held = Arc::new(AtomicI64::new(0));
            let (peak, granted) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicU64::new(0)));
            let mut tasks = Vec::new();
            for w in 0..24 {
                let (e, held, peak, granted) = (e.clone(), held.clone(), peak.clone(), granted.clone());
                tasks.push(tokio::spawn(async move {
                    let mut c = e.client().await;
                    for i in 0..25 {
                        let a = c.should_rate_limit(start(kind, "load")).await.unwrap().into_inner();
                        if a.overall_code != OK {
                            continue;
                        }
                        granted.fetch_add(1, SeqCst);
                        let now = held.fetch_add(1, SeqCst) + 1;
                        peak.fetch_max(now, SeqCst);
                        if (w + i) % 3 == 0 {
                            tokio::task::yield_now().await; // a stream that lasts a little
                        }
                        held.fetch_sub(1, SeqCst);
                        let a = c.should_rate_limit(end(kind, "load", 1)).await.unwrap().into_inner();
                        assert_eq!(a.overall_code, OK);
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let (peak, granted) = (peak.load(SeqCst), granted.load(SeqCst));
            println!("{kind}: {granted} streams of 600 attempts, at most {peak} at once");
            assert!(peak <= 3, "{kind}: {peak} streams at once");
            // every stream ended: all three free again, and no more
            assert!(granted >= 3, "{kind}: {granted} granted");
            let a = e.ask(start(kind, "load")).await;
            assert_eq!(rem(&a.statuses[0]), (OK, 2), "{kind}: every unit came back, none more");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_clears_the_local_over_limit_mark() {
    in_one_window(HOUR_MS, || async {
        let e = Env::start("negative-cache", INFLIGHT, &[("LOCAL_CACHE_SIZE_IN_BYTES", "4096")]).await;
        let mut r = e.redis();
        for _ in 0..3 {
            assert_eq!(e.ask(start("fw", "c")).await.overall_code, OK);
        }
        // over: marked until the hour's end; the next is denied from memory
        assert_eq!(e.ask(start("fw", "c")).await.overall_code, OVER);
        let calls = decision_calls(&mut r).0;
        assert_eq!(e.ask(start("fw", "c")).await.overall_code, OVER);
        assert_eq!(decision_calls(&mut r).0, calls, "denied from the cache, without Redis");
        // a stream ends: the mark goes with it, and the next start is Redis's to decide
        assert_eq!(e.ask(end("fw", "c", 1)).await.overall_code, OK);
        assert_eq!(e.ask(start("fw", "c")).await.overall_code, OK, "the refund's room was used");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_across_cluster_slots() {
    if !topology() {
        return;
    }
    in_one_window(HOUR_MS, || async {
        let nodes = common::start_cluster(3).await;
        let url = format!("127.0.0.1:{},127.0.0.1:{}", nodes[0].port, nodes[1].port);
        let vars = [("REDIS_TYPE", "cluster"), ("REDIS_URL", url.as_str())];
        let e = Env::serve("negative-cluster", &[INFLIGHT], &vars, 0, None).await;
        // 8 users' keys (spread over the slots), each full, then given one back in one request
        let users: Vec<String> = (0..8).map(|i| format!("u{i}")).collect();
        for u in &users {
            for _ in 0..3 {
                assert_eq!(e.ask(start("fw", u)).await.overall_code, OK);
            }
        }
        let mut all = end("fw", &users[0], 1);
        for u in &users[1..] {
            all.descriptors.push(end("fw", u, 1).descriptors.remove(0));
        }
        let a = e.ask(all).await;
        assert_eq!(a.overall_code, OK);
        assert!(a.statuses.iter().all(|s| rem(s) == (OK, 1)), "{:?}", a.statuses);
        for u in &users {
            assert_eq!(e.ask(start("fw", u)).await.overall_code, OK, "{u}: its unit came back");
            assert_eq!(e.ask(start("fw", u)).await.overall_code, OVER, "{u}: only one");
        }
    })
    .await;
}
