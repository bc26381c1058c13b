//! Usage reports (issue 46, item 4): Envoy AI Gateway and Envoy's
//! `apply_on_stream_done` send a request's token count after its response,
//! as the descriptor's own `hits_addend`, and ignore the answer. In the
//! domains of `USAGE_REPORT_DOMAINS` (`ai-gateway-quota` unless set) such a
//! descriptor is a debit (`FORCE`): taken even past the limit, so the next
//! check is denied, where the atomic rule would drop a report that does not
//! fit and under-enforce the budget. Per minute, as the issue asks, in one
//! minute window (a run that crosses one is run again).

use envoy_types::pb::google::protobuf::UInt64Value;

use crate::support::*;

const TOKENS: &str = r#"
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: tb
    rate_limit: {algorithm: token_bucket, unit: hour, requests_per_unit: 1, burst: 1000}
  - key: sl
    rate_limit: {algorithm: sliding_log, unit: hour, requests_per_unit: 1000}
  - key: sc
    rate_limit: {algorithm: sliding_counter, unit: hour, requests_per_unit: 1000}
"#;

/// Envoy AI Gateway's QuotaPolicy config, as its translator writes it: the
/// backend, then the model, a quota-mode limit on the leaf.
const AI_GATEWAY: &str = r#"
domain: ai-gateway-quota
descriptors:
  - key: backend_name
    value: default/openai
    descriptors:
      - key: model_name_override
        value: gpt-4
        quota_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1000}
"#;

/// A descriptor with its own `hits_addend`: 0 a check, above 0 a report.
fn own(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor { hits_addend: Some(UInt64Value { value: hits }), ..desc(entries) }
}

fn ai(hits: Option<u64>) -> RateLimitRequest {
    let e = [("backend_name", "default/openai"), ("model_name_override", "gpt-4")];
    req("ai-gateway-quota", vec![hits.map_or_else(|| desc(&e), |h| own(&e, h))])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_of_600_and_600_against_1000_a_minute_deny_the_next_check() {
    in_one_window(60_000, || async {
        let e = Env::start("reports", TOKENS, &[("USAGE_REPORT_DOMAINS", "llm")]).await;
        for kind in ["tenant", "tb", "sl", "sc"] {
            let t = [(kind, "t1")];
            let check = || req("llm", vec![own(&t, 0)]);
            let report = |n| req("llm", vec![own(&t, n)]);
            assert_eq!(e.ask(check()).await.overall_code, OK, "{kind}");
            let a = e.ask(report(600)).await;
            assert_eq!((a.overall_code, rem(&a.statuses[0])), (OK, (OK, 400)), "{kind}");
            assert_eq!(e.ask(check()).await.overall_code, OK, "{kind}: 400 left");
            // the second report does not fit: taken all the same, a debt of 200
            let a = e.ask(report(600)).await;
            assert_eq!((a.overall_code, rem(&a.statuses[0])), (OK, (OK, 0)), "{kind}: a report is never denied");
            let a = e.ask(check()).await;
            assert_eq!(a.overall_code, OVER, "{kind}: the next check is over the limit");
            // and a plain request too, whatever its size
            assert_eq!(e.ask(req("llm", vec![desc(&t)])).await.overall_code, OVER, "{kind}");
        }
        // the reports counted in total_hits, as envoyproxy/ratelimit counts them
        let m = e.svc.service.render_metrics();
        let line = m.lines().find(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{") && l.contains("tenant"));
        let total: u64 = line.unwrap().rsplit(' ').next().unwrap().parse().unwrap();
        assert_eq!(total, 1200 + 1, "two reports and the plain request (checks add 0)");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_the_report_domains_a_report_that_does_not_fit_is_dropped() {
    in_one_window(60_000, || async {
        let e = Env::start("reports-off", TOKENS, &[("USAGE_REPORT_DOMAINS", "none")]).await;
        let t = [("tenant", "t1")];
        assert_eq!(e.ask(req("llm", vec![own(&t, 600)])).await.overall_code, OK);
        // the atomic rule: denied, nothing taken
        assert_eq!(e.ask(req("llm", vec![own(&t, 600)])).await.overall_code, OVER);
        let a = e.ask(req("llm", vec![own(&t, 0)])).await;
        assert_eq!((a.overall_code, rem(&a.statuses[0])), (OK, (OK, 400)), "the budget is under-enforced");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_ai_gateway_quota_reports_by_default() {
    in_one_window(60_000, || async {
        let e = Env::start("reports-ai", AI_GATEWAY, &[]).await;
        // request time: one hit each (no hits_addend of its own), then the stream-done reports
        assert_eq!(e.ask(ai(None)).await.overall_code, OK);
        assert_eq!(e.ask(ai(Some(600))).await.overall_code, OK);
        assert_eq!(e.ask(ai(Some(600))).await.overall_code, OK, "the report past the budget is taken, not denied");
        let a = e.ask(ai(None)).await;
        assert_eq!(a.overall_code, OVER, "the next request is over its quota");
        assert_eq!(a.statuses[0].code, OVER);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_beside_a_request_time_limit_is_taken_and_the_other_decided_apart() {
    in_one_window(HOUR_MS, || async {
        let e = Env::start("reports-mixed", TOKENS, &[("USAGE_REPORT_DOMAINS", "*")]).await;
        // one request: a report past the token bucket, a plain hit on the sliding log
        let ds = vec![own(&[("tb", "m")], 1500), desc(&[("sl", "m")])];
        let a = e.ask(req("llm", ds)).await;
        assert_eq!(a.overall_code, OK);
        assert_eq!((rem(&a.statuses[0]), rem(&a.statuses[1])), ((OK, 0), (OK, 999)));
        assert_eq!(e.ask(req("llm", vec![desc(&[("tb", "m")])])).await.overall_code, OVER, "in debt");
        let a = e.ask(req("llm", vec![desc(&[("sl", "m")])])).await;
        assert_eq!(rem(&a.statuses[0]), (OK, 998), "the log took one hit each time");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_across_cluster_slots() {
    if !topology() {
        return;
    }
    in_one_window(HOUR_MS, || async {
        let nodes = common::start_cluster(3).await;
        let url = format!("127.0.0.1:{},127.0.0.1:{}", nodes[0].port, nodes[1].port);
        let vars = [("REDIS_TYPE", "cluster"), ("REDIS_URL", url.as_str()), ("USAGE_REPORT_DOMAINS", "llm")];
        let e = Env::serve("reports-cluster", &[TOKENS], &vars, 0, None).await;
        // 8 tenants' buckets (spread over the slots), each sent past its budget in one request
        let tenants: Vec<String> = (0..8).map(|i| format!("t{i}")).collect();
        let ds = tenants.iter().map(|t| own(&[("tb", t)], 1200)).collect();
        let a = e.ask(req("llm", ds)).await;
        assert_eq!(a.overall_code, OK);
        for t in &tenants {
            let a = e.ask(req("llm", vec![own(&[("tb", t)], 0)])).await;
            assert_eq!(a.overall_code, OVER, "{t}: in debt");
        }
    })
    .await;
}
