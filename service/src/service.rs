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
//! This file holds the live configuration and runs the steps: every part
//! of a request (counted, check-only, zero-limit, shadow) in one call.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, RwLock};

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use redis_ratelimit_client::Connection;

use crate::backend::{Backend, Redis};
use crate::config::Algorithm;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::overcache::OverCache;
use crate::plan::{Part, PartState, Plan};
use crate::respond::respond;
use crate::settings::Settings;
use ratelimit_core::catalogue::Kind;
use ratelimit_core::multi::{CHECK, SHADOW};

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
    /// Whether the live configuration has a domain (`HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    has_domains: tokio::sync::watch::Sender<bool>,
    /// `LOCAL_CACHE_SIZE_IN_BYTES`: the keys known over their limit.
    cache: Option<OverCache>,
    /// `TRACING_ENABLED=true`: the spans' tracer ([`Service::with_tracer`]).
    tracer: Option<Arc<crate::trace::Tracer>>,
}

impl<C: Connection> Service<C> {
    /// A service over a client and a first configuration.
    pub fn new(rl: redis_ratelimit_client::RateLimit<C>, config: Config, settings: Settings) -> Service<C> {
        Service {
            backend: Redis::new(rl, settings.panic_mode)
                .on_cluster(matches!(settings.redis_type, crate::settings::RedisType::Cluster { .. })),
            has_domains: tokio::sync::watch::Sender::new(!config.is_empty()),
            cache: OverCache::new(settings.local_cache_bytes),
            config: RwLock::new(Arc::new(config)),
            settings,
            refused: Mutex::new(None),
            metrics: Metrics::new(),
            tracer: None,
        }
    }

    /// The service with `TRACING_ENABLED`'s tracer.
    pub fn with_tracer(self, tracer: Option<Arc<crate::trace::Tracer>>) -> Service<C> {
        Service { tracer, ..self }
    }

    /// The tracer (`TRACING_ENABLED=true`).
    pub fn tracer(&self) -> Option<&Arc<crate::trace::Tracer>> {
        self.tracer.as_ref()
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
        if let Some(t) = &self.tracer {
            out.push_str(&t.render());
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
        let has_domains = !config.is_empty();
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.has_domains.send_replace(has_domains);
        self.metrics.config_load_success.fetch_add(1, Relaxed);
    }

    /// Whether the live configuration has a domain, and its changes.
    pub fn watch_domains(&self) -> tokio::sync::watch::Receiver<bool> {
        self.has_domains.subscribe()
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
        self.should_rate_limit_traced(req, None).await
    }

    /// [`should_rate_limit`](Self::should_rate_limit), the Redis call's
    /// times kept in `redis` (a traced request's).
    pub async fn should_rate_limit_traced(
        &self,
        req: &RateLimitRequest,
        redis: Option<&mut crate::trace::RedisCall>,
    ) -> Result<RateLimitResponse, ServiceError> {
        let t0 = std::time::Instant::now();
        let r = self.decide(req, redis).await;
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
    async fn decide(
        &self,
        req: &RateLimitRequest,
        mut redis: Option<&mut crate::trace::RedisCall>,
    ) -> Result<RateLimitResponse, ServiceError> {
        let cfg = self.config();
        let reports = self.settings.usage_reports(&req.domain);
        let mut plan = Plan::with_reports(req, &cfg, &self.settings.cache_key_prefix, reports)?;
        plan.quota_parts(self.settings.quota_mode);
        // counted before Redis is called, as envoyproxy/ratelimit counts them
        if !cfg.has_domain(&req.domain) {
            self.metrics.domain_not_found(&req.domain, req.descriptors.len() as u64);
        }
        for d in plan.descriptors.iter().filter(|d| d.limited() && !d.negative) {
            // a usage report's hits too: they are taken
            if let Some(m) = &d.matched {
                self.metrics.total_hits(d.detailed_key.as_deref().unwrap_or(&m.limit.full_key), d.hits);
            }
        }
        // upstream's span of the Redis call(s): for every request that gets this far
        let reported = plan.refunded.len() + plan.debited.len();
        if let Some(r) = redis.as_deref_mut() {
            r.begin(plan.counted.len() + plan.checked.len() + reported);
        }
        if !plan.refunded.is_empty() {
            // first, so that a denial from the cache never drops a refund
            let Plan { keys, refunded, .. } = &mut plan;
            self.backend.refund(keys, refunded).await?;
            if let Some(c) = &self.cache {
                for p in &plan.refunded {
                    c.unmark(plan.key(p));
                }
            }
        }
        if !plan.debited.is_empty() {
            // usage reports: taken past the limit, never denied, before the
            // request's other parts (the cache never drops one)
            let Plan { keys, debited, .. } = &mut plan;
            self.backend.debit(keys, debited).await?;
        }
        if let Some(c) = &self.cache {
            if from_cache(c, &mut plan, self.settings.shadow_mode) {
                if let Some(r) = redis {
                    // only the refunds and usage reports went to Redis
                    r.keys = reported;
                    if reported == 0 {
                        r.end_ns = r.start_ns;
                    } else {
                        r.end();
                    }
                }
                self.count_from_cache(&plan);
                return Ok(self.answer(req, &plan));
            }
        }
        // the marks count from before the call: they end no later than Redis said
        let t0 = self.cache.as_ref().map(OverCache::now_ms);
        let ran = run(&self.backend, &mut plan, self.settings.shadow_mode).await;
        if let Some(r) = redis {
            r.end();
        }
        ran?;
        if let (Some(c), Some(t0)) = (&self.cache, t0) {
            mark(c, &plan, t0);
        }
        Ok(self.answer(req, &plan))
    }

    /// The response to `req`, with its dynamic metadata when asked for.
    fn answer(&self, req: &RateLimitRequest, plan: &Plan) -> RateLimitResponse {
        let mut r = respond(plan, &self.settings, &self.metrics);
        if self.settings.response_dynamic_metadata {
            r.dynamic_metadata = Some(crate::respond::dynamic_metadata(req, plan, &r));
        }
        r
    }

    /// `over_limit_with_local_cache`: the hits of the descriptors a request
    /// was denied by from the cache (their `over_limit` too, in respond).
    fn count_from_cache(&self, plan: &Plan) {
        for d in &plan.descriptors {
            let (Some(p), Some(m), false) = (plan.part_of(d), &d.matched, d.negative) else { continue };
            if p.state.over && !p.state.redis {
                let key = d.detailed_key.as_deref().unwrap_or(&m.limit.full_key);
                self.metrics.with_key(key, |k| {
                    k.over_limit_with_local_cache.fetch_add(d.hits, Relaxed);
                });
            }
        }
    }
}

/// `LOCAL_CACHE_SIZE_IN_BYTES`: denies `plan` without Redis when one of
/// its parts that is not in shadow mode is marked over. That part answers
/// over (0 left, retry when its mark ends); the others are not read
/// (0 left); nothing is taken anywhere. Whether it denied.
fn from_cache(c: &OverCache, plan: &mut Plan, global_shadow: bool) -> bool {
    if global_shadow {
        return false; // no request is denied
    }
    let now = c.now_ms();
    let mut hit = false;
    let Plan { keys, counted, checked, .. } = plan;
    for p in counted.iter_mut().chain(checked.iter_mut()).filter(|p| !p.shadow) {
        if let Some(ms) = c.over_for(keys.get(p.key.clone()).unwrap_or_default(), now) {
            let retry_ms = i64::try_from(ms).unwrap_or(i64::MAX);
            p.state = PartState { over: true, remaining: 0, retry_ms, reset_ms: ms, redis: false };
            hit = true;
        }
    }
    hit
}

/// Marks the keys Redis left with nothing: a fixed window (or a zero
/// limit) with 0 remaining until its window's end; another algorithm that
/// denied one unit with 0 remaining, until its retry time; from `now`,
/// the cache's time before the call.
fn mark(c: &OverCache, plan: &Plan, now: u64) {
    for p in plan.counted.iter().chain(&plan.checked) {
        let s = &p.state;
        if !s.redis || s.remaining != 0 {
            continue;
        }
        let ms = if p.shape.limit == 0 || p.shape.algorithm == Algorithm(Kind::FixedWindow) {
            s.reset_ms
        } else if s.over && p.shape.weight == 1 && s.retry_ms > 0 {
            s.retry_ms as u64
        } else {
            continue;
        };
        c.mark(plan.keys.get(p.key.clone()).unwrap_or_default(), ms, now);
    }
}

/// Decides a plan's parts on `backend` in one atomic call (one instant):
/// the counted parts, the check-only ones (`CHECK`: they take nothing and
/// deny when nothing is left), the `requests_per_unit: 0` ones (a limit
/// that never fits) and the shadow-mode ones (`SHADOW`: they never deny,
/// and take their hits when the request is granted and they fit, each on
/// its own); with `SHADOW_MODE` on every part is a shadow part. A request
/// denied by a part that is not a shadow part takes nothing anywhere.
pub async fn run<B: Backend>(backend: &B, plan: &mut Plan, global_shadow: bool) -> Result<(), ServiceError> {
    let Plan { keys, counted, checked, .. } = plan;
    let shadow = |p: &Part| if p.shadow || global_shadow { SHADOW } else { 0 };
    for p in counted.iter_mut() {
        p.shape.flags = shadow(p);
    }
    for p in checked.iter_mut() {
        // one unit to fit: over when nothing is left, whatever the merged hits
        (p.shape.flags, p.shape.weight) = (CHECK | shadow(p), 1);
    }
    if checked.is_empty() {
        if !counted.is_empty() {
            backend.decide(keys, counted, 1).await?;
        }
    } else if counted.is_empty() {
        backend.decide(keys, checked, 1).await?;
    } else {
        Box::pin(counted_and_checked(backend, keys, counted, checked)).await?;
    }
    for p in checked.iter_mut() {
        // a check is over the limit when nothing is left
        p.state.over = p.state.remaining == 0;
    }
    for p in counted.iter_mut().chain(checked.iter_mut()).filter(|p| p.shape.limit == 0) {
        // `requests_per_unit: 0`: over, nothing left, its window's end
        let reset_ms = crate::respond::ms_until_window_end(p.shape.window_ms);
        p.state = PartState { over: true, remaining: 0, retry_ms: -1, reset_ms, redis: p.state.redis };
    }
    Ok(())
}

/// The counted parts and the check-only ones in one call (requests with a
/// `hits_addend` of 0, rare, out of line: boxed, so that the copy does not
/// make every request's future larger): the parts one after another, then
/// each back in its list.
async fn counted_and_checked<B: Backend>(
    backend: &B,
    keys: &str,
    counted: &mut [Part],
    checked: &mut [Part],
) -> Result<(), ServiceError> {
    let mut all: Vec<Part> = counted.iter().chain(checked.iter()).cloned().collect();
    backend.decide(keys, &mut all, 1).await?;
    let (c, k) = all.split_at(counted.len());
    counted.clone_from_slice(c);
    checked.clone_from_slice(k);
    Ok(())
}

#[cfg(test)]
mod tests {
    //! [`run`] without Redis: a backend that answers from the keys (nothing
    //! left when the key names `shadow` or `tight`), by RL.MULTI's rules for
    //! CHECK and SHADOW, and records its calls.
    use std::sync::Mutex;

    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::google::protobuf::UInt64Value;

    use super::*;

    fn key_of<'k>(keys: &'k str, p: &Part) -> &'k str {
        &keys[p.key.clone()]
    }

    #[derive(Default)]
    struct Answers(Mutex<Vec<Vec<(String, u8)>>>);

    impl Backend for Answers {
        async fn decide(&self, keys: &str, parts: &mut [Part], _cost: u64) -> Result<bool, ServiceError> {
            self.0.lock().unwrap().push(parts.iter().map(|p| (key_of(keys, p).to_owned(), p.shape.flags)).collect());
            let fits = |p: &Part| {
                let full = key_of(keys, p).contains("shadow") || key_of(keys, p).contains("tight");
                !full && p.shape.limit > 0
            };
            let all_shadow = parts.iter().all(|p| p.shape.flags & SHADOW != 0);
            let granted = all_shadow || parts.iter().filter(|p| p.shape.flags & SHADOW == 0).all(fits);
            for p in parts.iter_mut() {
                let fit = fits(p);
                p.state = PartState {
                    over: !fit,
                    remaining: if fit { 3 } else { 0 },
                    retry_ms: i64::from(!fit),
                    reset_ms: 9,
                    redis: true,
                };
                p.taken = granted && fit && p.shape.flags & CHECK == 0;
            }
            Ok(granted)
        }

        async fn refund(&self, _keys: &str, _parts: &mut [Part]) -> Result<(), ServiceError> {
            unreachable!("run never refunds: Service::decide does, before it")
        }

        async fn debit(&self, _keys: &str, _parts: &mut [Part]) -> Result<(), ServiceError> {
            unreachable!("run never debits: Service::decide does, before it")
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
  - key: zero
    rate_limit: {unit: hour, requests_per_unit: 0}
";

    fn desc(k: &str, hits: Option<u64>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: vec![Entry { key: k.into(), value: "v".into() }],
            hits_addend: hits.map(|value| UInt64Value { value }),
            ..RateLimitDescriptor::default()
        }
    }

    async fn decided(ds: Vec<RateLimitDescriptor>, global_shadow: bool) -> (Plan, Vec<Vec<(String, u8)>>) {
        let cfg = Config::load([("f", YAML)], false).unwrap();
        let req = RateLimitRequest { domain: "d".into(), descriptors: ds, hits_addend: 0 };
        let mut plan = Plan::new(&req, &cfg, "").unwrap();
        let backend = Answers::default();
        run(&backend, &mut plan, global_shadow).await.unwrap();
        let calls = std::mem::take(&mut *backend.0.lock().unwrap());
        (plan, calls)
    }

    fn key(k: &str) -> String {
        format!("d_{k}_v_3600")
    }

    #[tokio::test]
    async fn every_kind_of_descriptor_in_one_call() {
        let ds = vec![desc("shadow", None), desc("user", None), desc("tight", Some(0)), desc("zero", None)];
        let (plan, calls) = decided(ds, false).await;
        let want = [(key("shadow"), SHADOW), (key("user"), 0), (key("zero"), 0), (key("tight"), CHECK)];
        assert_eq!(calls, [want.to_vec()]);
        assert!(plan.counted.iter().chain(&plan.checked).all(|p| !p.taken), "denied: nothing taken anywhere");
        assert!(plan.checked[0].state.over && plan.counted[2].state.over, "the check and the zero limit are over");
    }

    #[tokio::test]
    async fn shadow_parts_never_deny_and_count_on_their_own() {
        let (plan, calls) = decided(vec![desc("shadow", None), desc("user", None)], false).await;
        assert_eq!(calls.len(), 1);
        assert!(plan.counted[1].taken && !plan.counted[0].taken, "the enforced part took its hit");
        // SHADOW_MODE on: every part a shadow part, each within its limit counts
        let (plan, calls) = decided(vec![desc("tight", None), desc("user", None), desc("user", Some(0))], true).await;
        assert_eq!(calls, [vec![(key("tight"), SHADOW), (key("user"), SHADOW), (key("user"), CHECK | SHADOW)]]);
        assert!(plan.counted[1].taken && !plan.counted[0].taken && !plan.checked[0].taken);
    }

    #[tokio::test]
    async fn a_check_takes_nothing_and_denies_when_nothing_is_left() {
        let (plan, _) = decided(vec![desc("user", Some(0)), desc("user", None)], false).await;
        assert!(!plan.checked[0].state.over && !plan.checked[0].taken && plan.counted[0].taken);
        let (plan, _) = decided(vec![desc("tight", Some(0)), desc("user", None)], false).await;
        assert!(plan.checked[0].state.over && !plan.counted[0].taken, "denied by the check: the other takes nothing");
        // a zero limit alone, checked: over, in one call
        let (plan, calls) = decided(vec![desc("zero", Some(0))], false).await;
        assert_eq!((calls.len(), plan.checked[0].state.over), (1, true));
    }
}
