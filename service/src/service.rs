//! `ShouldRateLimit`: a request's descriptors matched against the
//! configuration and decided together in one atomic `RL.MULTI`, answered as
//! envoyproxy/ratelimit answers. Three steps, each a file:
//!
//! * [`crate::plan`] — the request and the configuration give the parts to
//!   decide (pure);
//! * [`crate::backend`] — the parts decided in one call on Redis (the Rust
//!   client), or by `PANIC_MODE` while Redis is unavailable;
//! * [`crate::respond`] — the parts' states give the statuses, the headers
//!   and the statistics (pure).
//!
//! This file holds the live configuration and runs the steps: the counted
//! parts and the check-only ones in two calls at the same time, and a
//! second call when only shadow-mode limits denied.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, RwLock};

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use redis_ratelimit_client::Connection;

use crate::backend::{Backend, Redis};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::plan::{Part, Plan};
use crate::respond::respond;
use crate::settings::Settings;

pub use crate::error::ServiceError;
pub use crate::plan::{cache_key, cache_key_tagged, cache_key_with, MAX_LIMITED_DESCRIPTORS};
pub use crate::respond::{ms_until_window_end, seconds_until_reset};

/// The rate-limit service: the live configuration, the backend, the settings.
pub struct Service<C> {
    backend: Redis<C>,
    config: RwLock<Arc<Config>>,
    settings: Settings,
    /// The error of the last configuration refused since the last one loaded.
    refused: Mutex<Option<String>>,
    /// The statistics (`/metrics`).
    metrics: Metrics,
}

impl<C: Connection> Service<C> {
    /// A service over a client and a first configuration.
    pub fn new(rl: redis_ratelimit_client::RateLimit<C>, config: Config, settings: Settings) -> Service<C> {
        Service {
            backend: Redis::new(rl, settings.panic_mode)
                .on_cluster(matches!(settings.redis_type, crate::settings::RedisType::Cluster { .. })),
            config: RwLock::new(Arc::new(config)),
            settings,
            refused: Mutex::new(None),
            metrics: Metrics::new(),
        }
    }

    /// The statistics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The Prometheus text of the statistics and of the client's counters.
    pub fn render_metrics(&self) -> String {
        let mut out = self.render_metrics_only();
        if self.backend.cluster {
            out.push_str(&self.backend.spread().render());
        }
        out
    }

    fn render_metrics_only(&self) -> String {
        let m = self.backend.client().metrics();
        self.metrics.render_as(
            &self.settings,
            &[
                ("redis_ratelimit_client_redis_calls", "Redis calls made by the client.", m.calls),
                (
                    "redis_ratelimit_client_redis_failures",
                    "Redis calls that failed or timed out (REDIS_TIMEOUT).",
                    m.failures,
                ),
                ("redis_ratelimit_client_breaker_trips", "Times the client's circuit breaker opened.", m.trips),
                (
                    "redis_ratelimit_client_decisions_unavailable",
                    "Decisions Redis did not give (timeout, failure, breaker open).",
                    m.decisions_panic,
                ),
            ],
        )
    }

    /// The live configuration.
    pub fn config(&self) -> Arc<Config> {
        self.config.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Makes `config` the live configuration (requests already running keep theirs).
    pub fn set_config(&self, config: Config) {
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.metrics.config_load_success.fetch_add(1, Relaxed);
    }

    /// Records why a configuration was refused (the live one stays).
    pub fn refuse_config(&self, error: String) {
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
        self.metrics.config_load_error.fetch_add(1, Relaxed);
    }

    /// The error of the last configuration refused since one last loaded, if any.
    pub fn last_refusal(&self) -> Option<String> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// `ShouldRateLimit`, timed and counted in the statistics.
    pub async fn should_rate_limit(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, ServiceError> {
        let t0 = std::time::Instant::now();
        let r = self.decide(req).await;
        self.metrics.observe(t0.elapsed());
        match &r {
            Ok(_) => {}
            Err(ServiceError::Unavailable(_) | ServiceError::Internal(_)) => {
                self.metrics.redis_error.fetch_add(1, Relaxed);
            }
            Err(ServiceError::Invalid(_)) => {
                self.metrics.service_error.fetch_add(1, Relaxed);
            }
        }
        r
    }

    /// Plan, backend, respond.
    async fn decide(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, ServiceError> {
        let cfg = self.config();
        let mut plan = Plan::new(req, &cfg, &self.settings.cache_key_prefix)?;
        // counted before Redis is called, as envoyproxy/ratelimit counts them
        if !cfg.has_domain(&req.domain) {
            self.metrics.domain_not_found(&req.domain, req.descriptors.len() as u64);
        }
        for d in plan.descriptors.iter().filter(|d| d.limited()) {
            if let Some(m) = &d.matched {
                self.metrics.total_hits(d.detailed_key.as_deref().unwrap_or(&m.limit.full_key), d.hits);
            }
        }
        run(&self.backend, &mut plan, self.settings.shadow_mode).await?;
        Ok(respond(&plan, &self.settings, &self.metrics))
    }
}

/// Decides a plan's parts on `backend`: the counted parts in one call and
/// the check-only ones in another with cost 0, at the same time; then,
/// when the request passes though denied (only shadow-mode limits denied,
/// or `SHADOW_MODE` is on), the parts within their limits again, so that
/// they count the request that passes, as envoyproxy/ratelimit's counters
/// would.
pub async fn run<B: Backend>(backend: &B, plan: &mut Plan, global_shadow: bool) -> Result<(), ServiceError> {
    let Plan { keys, counted, checked, .. } = plan;
    let allowed = if checked.is_empty() {
        if counted.is_empty() {
            None
        } else {
            Some(backend.decide(keys, counted, 1).await?)
        }
    } else {
        Box::pin(counted_and_checked(backend, keys, counted, checked)).await?
    };
    for p in checked.iter_mut() {
        // a check is over the limit when nothing is left
        p.state.over = p.state.remaining == 0;
    }
    let Some(allowed) = allowed else { return Ok(()) };
    for p in counted.iter_mut() {
        p.taken = allowed;
    }
    let over = || (0..plan.counted.len()).filter(|&j| plan.counted[j].state.over);
    let shadow_only = !allowed && over().next().is_some() && over().all(|j| plan.counted[j].shadow);
    if shadow_only || (global_shadow && !allowed) {
        Box::pin(count_within(backend, plan)).await?;
    }
    Ok(())
}

/// The counted parts and the check-only ones at the same time: requests
/// with a `hits_addend` of 0, rare, out of line (boxed) so that their
/// second call does not make every request's future larger. Whether the
/// counted parts took their units, if there are any.
async fn counted_and_checked<B: Backend>(
    backend: &B,
    keys: &str,
    counted: &mut [Part],
    checked: &mut [Part],
) -> Result<Option<bool>, ServiceError> {
    let (main, check) = tokio::join!(
        async {
            if counted.is_empty() {
                Ok(None)
            } else {
                backend.decide(keys, counted, 1).await.map(Some)
            }
        },
        backend.decide(keys, checked, 0),
    );
    let main = main?;
    check?;
    Ok(main)
}

/// Denied, yet the request passes: the limits it is within count it (a
/// second call without the ones over; rare, out of line).
async fn count_within<B: Backend>(backend: &B, plan: &mut Plan) -> Result<(), ServiceError> {
    let keep: Vec<usize> = (0..plan.counted.len()).filter(|&j| !plan.counted[j].state.over).collect();
    if keep.is_empty() {
        return Ok(());
    }
    let mut parts: Vec<Part> = keep.iter().map(|&j| plan.counted[j].clone()).collect();
    let allowed = backend.decide(&plan.keys, &mut parts, 1).await?;
    for (&j, p) in keep.iter().zip(parts) {
        (plan.counted[j].state, plan.counted[j].taken) = (p.state, allowed);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! [`run`] without Redis: a backend that answers from the keys (over
    //! when the key names `shadow` or `tight`) and records its calls.
    use std::sync::Mutex;

    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::google::protobuf::UInt64Value;

    use super::*;
    use crate::plan::PartState;

    fn key_of<'k>(keys: &'k str, p: &Part) -> &'k str {
        &keys[p.key.clone()]
    }

    #[derive(Default)]
    struct Answers(Mutex<Vec<(Vec<String>, u64)>>);

    impl Backend for Answers {
        async fn decide(&self, keys: &str, parts: &mut [Part], cost: u64) -> Result<bool, ServiceError> {
            self.0.lock().unwrap().push((parts.iter().map(|p| key_of(keys, p).to_owned()).collect(), cost));
            for p in parts.iter_mut() {
                // a check (cost 0) always fits: over only by its remaining 0
                let full = key_of(keys, p).contains("shadow") || key_of(keys, p).contains("tight");
                let over = full && cost > 0;
                p.state = PartState { over, remaining: if full { 0 } else { 3 }, retry_ms: i64::from(over), reset_ms: 9 };
            }
            Ok(parts.iter().all(|p| !p.state.over))
        }
    }

    const YAML: &str = "
domain: d
descriptors:
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tight
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
";

    fn desc(k: &str, hits: Option<u64>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: vec![Entry { key: k.into(), value: "v".into() }],
            hits_addend: hits.map(|value| UInt64Value { value }),
            ..RateLimitDescriptor::default()
        }
    }

    async fn decided(ds: Vec<RateLimitDescriptor>, global_shadow: bool) -> (Plan, Vec<(Vec<String>, u64)>) {
        let cfg = Config::load([("f", YAML)], false).unwrap();
        let req = RateLimitRequest { domain: "d".into(), descriptors: ds, hits_addend: 0 };
        let mut plan = Plan::new(&req, &cfg, "").unwrap();
        let backend = Answers::default();
        run(&backend, &mut plan, global_shadow).await.unwrap();
        let calls = std::mem::take(&mut *backend.0.lock().unwrap());
        (plan, calls)
    }

    #[tokio::test]
    async fn denied_only_by_shadow_limits_the_enforced_ones_count_the_request() {
        let (plan, calls) = decided(vec![desc("shadow", None), desc("user", None)], false).await;
        let both = vec!["d_shadow_v_3600".to_owned(), "d_user_v_3600".to_owned()];
        assert_eq!(calls, [(both.clone(), 1), (vec!["d_user_v_3600".to_owned()], 1)]);
        assert!(plan.counted[1].taken && !plan.counted[0].taken, "the enforced part took its hit, the second time");
        // SHADOW_MODE on: the same (the request passes)
        let user = vec!["d_user_v_3600".to_owned()];
        assert_eq!(decided(vec![desc("shadow", None), desc("user", None)], true).await.1, [(both, 1), (user.clone(), 1)]);
        // SHADOW_MODE on, an enforced limit over: the others count the request that passes
        let (plan, calls) = decided(vec![desc("tight", None), desc("user", None)], true).await;
        assert_eq!(calls[1], (user, 1));
        assert!(plan.counted[1].taken && !plan.counted[0].taken);
        // an enforced limit over too: no second call
        assert_eq!(decided(vec![desc("shadow", None), desc("tight", None)], false).await.1.len(), 1);
    }

    #[tokio::test]
    async fn checks_go_in_their_own_call_with_cost_0_over_when_nothing_is_left() {
        let (plan, mut calls) =
            decided(vec![desc("tight", Some(0)), desc("user", Some(0)), desc("user", None)], false).await;
        calls.sort();
        let key = |k: &str| format!("d_{k}_v_3600");
        assert_eq!(calls, [(vec![key("tight"), key("user")], 0), (vec![key("user")], 1)]);
        assert_eq!(plan.checked.iter().map(|p| p.state.over).collect::<Vec<_>>(), [true, false]);
        assert!(plan.checked.iter().all(|p| !p.taken) && plan.counted[0].taken);
    }
}
