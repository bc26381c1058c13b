//! Redis Cluster (atomic requests, domains spread over the primaries) and
//! Sentinel (a failover followed).

use crate::support::*;

const DOMAIN_CONFIG: &str = r#"
domain: DOMAIN
descriptors:
  - key: site
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
"#;

/// The atomic scenario of `two_descriptors_are_atomic`, in `domain`.
async fn atomic_in(e: &Env, domain: &str) {
    let both = |u: &str| req(domain, vec![desc(&[("site", "")]), desc(&[("user", u)])]);
    let ask = |r| e.ask(r);
    let mut got = Vec::new();
    for _ in 0..4 {
        let a = ask(both("bob")).await;
        got.push((a.overall_code, rem(&a.statuses[0]), rem(&a.statuses[1])));
    }
    assert_eq!(
        got,
        vec![(OK, (OK, 99), (OK, 1)), (OK, (OK, 98), (OK, 0)), (OVER, (OK, 98), (OVER, 0)), (OVER, (OK, 98), (OVER, 0))],
        "{domain}"
    );
    let a = ask(both("amy")).await;
    assert_eq!((a.overall_code, rem(&a.statuses[0]), rem(&a.statuses[1])), (OK, (OK, 97), (OK, 1)), "{domain}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_requests_are_atomic_and_domains_spread() {
    in_one_window(HOUR_MS, || async {
        if !topology() {
            return;
        }
        let nodes = common::start_cluster(3).await;
        // a domain on each primary: the hash tag is the domain
        let mut domains: Vec<Option<String>> = vec![None; 3];
        for i in 0.. {
            let d = format!("dom{i}");
            let owner = common::slot_owner(&nodes, redis_ratelimit_client::key_slot(format!("x{{{d}}}y")));
            domains[owner].get_or_insert(d);
            if domains.iter().all(Option::is_some) {
                break;
            }
        }
        let domains: Vec<String> = domains.into_iter().map(Option::unwrap).collect();
        let configs: Vec<String> = domains.iter().map(|d| DOMAIN_CONFIG.replace("DOMAIN", d)).collect();
        let configs: Vec<&str> = configs.iter().map(String::as_str).collect();
        // two seeds of the three, as REDIS_URL lists them
        let url = format!("127.0.0.1:{},127.0.0.1:{}", nodes[0].port, nodes[1].port);
        let vars = [("REDIS_TYPE", "cluster"), ("REDIS_URL", url.as_str()), ("CACHE_KEY_PREFIX", "rl_")];
        let e = Env::serve("cluster", &configs, &vars, 0, None).await;
        for d in &domains {
            atomic_in(&e, d).await;
        }
        // no hash tag: the keys are hashed whole and spread over the primaries
        let mut all = Vec::new();
        let mut nodes_used = 0;
        for n in &nodes {
            let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut n.sync()).unwrap();
            nodes_used += usize::from(!keys.is_empty());
            all.extend(keys);
        }
        all.sort();
        let mut want: Vec<String> = domains
            .iter()
            .flat_map(|d| [format!("rl_{d}_site__3600"), format!("rl_{d}_user_amy_3600"), format!("rl_{d}_user_bob_3600")])
            .collect();
        want.sort();
        assert_eq!(all, want);
        assert!(nodes_used > 1, "the keys spread");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_is_followed() {
    in_one_window(HOUR_MS, || async {
        if !topology() {
            return;
        }
        let mut primary = common::Server::start(true);
        let replica = common::Server::start_with(true, &["--replicaof", "127.0.0.1", &primary.port.to_string()]);
        let sentinels = common::Sentinel::start_three(primary.port).await;
        let url = std::iter::once("mymaster".to_owned())
            .chain(sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port)))
            .collect::<Vec<_>>()
            .join(",");
        let mut vars = stall_env().to_vec();
        vars.extend([("REDIS_TYPE", "sentinel"), ("REDIS_URL", url.as_str())]);
        let e = Env::serve("sentinel", &[CONFIG], &vars, 0, None).await;
        let mut c = e.client().await;
        let site = || req("basic", vec![desc(&[("site", "")])]);
        for left in [99, 98, 97] {
            assert_eq!(rem(&e.ask(site()).await.statuses[0]), (OK, left));
        }
        // every count on the replica before the kill
        let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut primary.sync()).unwrap();
        assert_eq!(acked, 1);
        primary.kill();
        let t0 = Instant::now();
        let mut unavailable = 0;
        let a = loop {
            let (a, took) = timed(&mut c, site()).await;
            within_bound(took, "during the failover");
            match a {
                Ok(a) => break a,
                Err(s) => assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}"),
            }
            unavailable += 1;
            assert!(t0.elapsed() < Duration::from_secs(60), "no failover within 60 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        println!("failover followed after {:.1} s, {unavailable} UNAVAILABLE answers", t0.elapsed().as_secs_f64());
        assert!(unavailable > 0, "the kill was seen");
        assert_eq!(common::role(&replica), "master");
        // the promoted replica goes on from the replicated count
        assert_eq!(rem(&a.statuses[0]), (OK, 96));
    })
    .await;
}
