//! Over-admission: many concurrent clients, one user over its limit and
//! a site-wide limit in every request.

use super::*;

/// The user of over-admission request j: three in four from "abuser", the
/// rest spread over 100 users (10 requests each for 4000).
pub(crate) fn oa_user(j: usize) -> String {
    if value(j as u64, 7, 4) != 0 {
        "abuser".into()
    } else {
        format!("u{}", value(j as u64, 8, 100))
    }
}

#[derive(Default, Clone)]
pub(crate) struct OaResult {
    /// grants per user key, and in total (the site key's grants)
    pub(crate) grants: HashMap<String, u64>,
    pub(crate) requests: HashMap<String, u64>,
    pub(crate) total_grants: u64,
    /// what the site counter holds at the end
    pub(crate) site_counter: u64,
    pub(crate) abuser_counter: u64,
    /// requests answered with an error (counted as not granted)
    pub(crate) errors: u64,
}

/// Waits until the service answers OK again (up to 10 s): after an
/// overload, the Rust client's breaker stays open for a second and then
/// probes; a phase starting meanwhile would only count UNAVAILABLE answers.
pub(crate) async fn settle(cl: &Arc<Clients>) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if let Ok(r) = cl.get(0).should_rate_limit(bench_request(u64::MAX / 2, 1, 1)).await {
            if r.get_ref().overall_code == OK {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("  the service did not answer OK within 10 s");
}

pub(crate) async fn oa_run(mode: Mode, cl: &Arc<Clients>, url: &str, a: &Args) -> OaResult {
    settle(cl).await;
    let m = a.oa_requests;
    let next = Arc::new(AtomicU64::new(0));
    let results: Arc<std::sync::Mutex<OaResult>> = Arc::default();
    let prefix = match mode {
        Mode::Service => "",
        Mode::IncrExpire => "incr:",
        Mode::GetFirst => "get:",
    };
    let client = redis::Client::open(url).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..a.oa_clients {
        let (next, results, cl) = (next.clone(), results.clone(), cl.clone());
        // one connection per concurrent client: many envoyproxy/ratelimit instances
        let mut con = client.get_multiplexed_async_connection().await.unwrap();
        tasks.push(tokio::spawn(async move {
            loop {
                let j = next.fetch_add(1, Relaxed) as usize;
                if j >= m {
                    break;
                }
                let user = oa_user(j);
                let entries = [("user".to_owned(), user.clone()), ("site".to_owned(), "all".to_owned())];
                let granted = match mode {
                    Mode::Service => {
                        let req = RateLimitRequest {
                            domain: "oa".into(),
                            descriptors: entries
                                .iter()
                                .map(|(k, v)| RateLimitDescriptor {
                                    entries: vec![Entry { key: k.clone(), value: v.clone() }],
                                    ..Default::default()
                                })
                                .collect(),
                            hits_addend: 0,
                        };
                        match cl.get(j as u64).should_rate_limit(req).await {
                            Ok(r) => r.get_ref().overall_code == OK,
                            Err(e) => {
                                eprintln!("  over-admission request {j}: {e}");
                                results.lock().unwrap().errors += 1;
                                false
                            }
                        }
                    }
                    _ => {
                        let now = now_s();
                        let ks: Vec<String> = entries
                            .iter()
                            .map(|e| envoy_key(prefix, "oa", std::slice::from_ref(e), OA_UNIT_S, now))
                            .collect();
                        let after =
                            envoy_decide(&mut con, &ks, &[OA_USER_LIMIT, OA_SITE_LIMIT], OA_UNIT_S, mode == Mode::GetFirst)
                                .await;
                        after[0] <= OA_USER_LIMIT && after[1] <= OA_SITE_LIMIT
                    }
                };
                let mut r = results.lock().unwrap();
                *r.requests.entry(user.clone()).or_default() += 1;
                if granted {
                    *r.grants.entry(user).or_default() += 1;
                    r.total_grants += 1;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut r = results.lock().unwrap().clone();
    // the counters at the end
    let now = now_s();
    match mode {
        Mode::Service => {
            // a check-only request (hits_addend 0 per descriptor): limit − remaining
            let req = RateLimitRequest {
                domain: "oa".into(),
                descriptors: [("user", "abuser"), ("site", "all")]
                    .iter()
                    .map(|(k, v)| RateLimitDescriptor {
                        entries: vec![Entry { key: (*k).into(), value: (*v).into() }],
                        hits_addend: Some(UInt64Value { value: 0 }),
                        ..Default::default()
                    })
                    .collect(),
                hits_addend: 0,
            };
            settle(cl).await;
            match cl.get(0).should_rate_limit(req).await {
                Ok(resp) => {
                    let resp = resp.into_inner();
                    r.abuser_counter = OA_USER_LIMIT - u64::from(resp.statuses[0].limit_remaining);
                    r.site_counter = OA_SITE_LIMIT - u64::from(resp.statuses[1].limit_remaining);
                }
                Err(e) => {
                    eprintln!("  over-admission: the counters could not be read: {e}");
                    r.errors += 1;
                }
            }
        }
        _ => {
            let mut con = client.get_multiplexed_async_connection().await.unwrap();
            let k = |e: (&str, &str)| envoy_key(prefix, "oa", &[(e.0.to_owned(), e.1.to_owned())], OA_UNIT_S, now);
            let (ua, site): (Option<u64>, Option<u64>) = redis::pipe()
                .cmd("GET")
                .arg(k(("user", "abuser")))
                .cmd("GET")
                .arg(k(("site", "all")))
                .query_async(&mut con)
                .await
                .unwrap();
            r.abuser_counter = ua.unwrap_or(0);
            r.site_counter = site.unwrap_or(0);
        }
    }
    r
}
