//! The client on a Redis Cluster (redis-rs `cluster-async`): three
//! module-loaded primaries made by `redis-cli --cluster create`; decisions
//! for tenants on every node are exact, `all_of` keys that share a hash
//! tag go to their slot's node, and after `redis-cli --cluster reshard`
//! moves live tenants' slots (their keys by MIGRATE) the client follows
//! MOVED and every limit goes on exactly. Strict mode is refused there.
use rl_test_support as common;

use std::time::Duration;

use common::{cli, node_id, slot_owner, start_cluster, wait_ok, Server};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis_ratelimit_client::*;

const HOUR: u64 = 3_600_000;
/// `n` calls per tenant on each limiter, adding up (bucket, all_of) grants.
async fn round(
    api: &Limiter<ClusterConnection>,
    both: &Limiter<ClusterConnection>,
    tenants: &[String],
    n: usize,
    granted: &mut [(u64, u64)],
) {
    for _ in 0..n {
        for (t, g) in tenants.iter().zip(granted.iter_mut()) {
            let d = api.limit(&make_key(t, &["api"]).unwrap(), Call::default()).await.unwrap();
            assert_ne!(d.source, Source::Panic, "{t}: {d:?}");
            g.0 += d.granted;
            g.1 += both.limit(&make_key(t, &["u7"]).unwrap(), Call::default()).await.unwrap().granted;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_stay_exact_across_a_reshard() {
    let nodes: Vec<Server> = start_cluster(3).await;

    let client = ClusterClient::builder(nodes.iter().map(|s| s.url()).collect::<Vec<_>>())
        .connection_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let conn: ClusterConnection = client.get_async_connection().await.unwrap();
    let rl = RateLimit::new(conn, Options { timeout_ms: 2000, ..Options::default() }).unwrap();
    assert_eq!(rl.detect().await.unwrap(), Source::Module);
    let api = rl.limiter(token_bucket("api", 5, 1, HOUR).unwrap(), Panic::default()).unwrap();
    let both = all_of(vec![token_bucket("user", 4, 1, HOUR).unwrap(), sliding_log("tenant", 100, HOUR).unwrap()], None);
    let both = rl.limiter(both.unwrap(), Panic::default()).unwrap();

    // 24 tenants: the first node's (its slots are the ones resharded) and
    // the others'
    let tenants: Vec<String> = (0..24).map(|i| format!("t{i}")).collect();
    let on_first: Vec<&String> = tenants.iter().filter(|t| slot_owner(&nodes, key_slot(t.as_str())) == 0).collect();
    assert!(on_first.len() >= 3 && on_first.len() < tenants.len(), "{on_first:?}");
    // per tenant: units granted by the bucket, and by the all_of
    let mut granted = vec![(0u64, 0u64); tenants.len()];
    round(&api, &both, &tenants, 3, &mut granted).await;

    // move every slot of the first node to the second, keys and all
    let moved = 16384 / 3;
    cli(&[
        "--cluster".into(),
        "reshard".into(),
        format!("127.0.0.1:{}", nodes[0].port),
        "--cluster-from".into(),
        node_id(&nodes[0]),
        "--cluster-to".into(),
        node_id(&nodes[1]),
        "--cluster-slots".into(),
        moved.to_string(),
        "--cluster-yes".into(),
    ]);
    wait_ok(&nodes).await;
    for t in &on_first {
        assert_eq!(slot_owner(&nodes, key_slot(t.as_str())), 1, "{t} not moved");
    }

    round(&api, &both, &tenants, 4, &mut granted).await;
    // 7 calls per tenant: the bucket of 5 granted 5, the all_of's user
    // bucket of 4 granted 4, resharded or not
    assert_eq!(granted, vec![(5, 4); tenants.len()], "(bucket, all_of) per tenant");
    let m = rl.metrics();
    assert_eq!((m.failures, m.decisions_panic), (0, 0), "{m:?}");
    println!("{} tenants ({} resharded with their keys): every limit exact", tenants.len(), on_first.len());

    // strict mode is refused on a cluster (WAIT has no key), before any decision
    let conn: ClusterConnection = client.get_async_connection().await.unwrap();
    let strict = Some(Strict::default());
    let srl = RateLimit::new(conn, Options { timeout_ms: 2000, strict, ..Options::default() }).unwrap();
    let lim = srl.limiter(token_bucket("api", 5, 1, HOUR).unwrap(), Panic::default()).unwrap();
    let e = lim.limit(&make_key("t0", &["strict"]).unwrap(), Call::default()).await.unwrap_err();
    assert!(matches!(e, Error::Unsupported(ref m) if m.contains("Cluster")), "{e}");
    let mut c = nodes[slot_owner(&nodes, key_slot("t0"))].sync();
    let n: i64 = redis::cmd("EXISTS").arg("rl:{t0}:strict").query(&mut c).unwrap();
    assert_eq!(n, 0);
}
