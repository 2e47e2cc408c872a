//! `ShouldRateLimit`: every descriptor of a request found in the configuration, decided by the store, and
//! answered as Envoy expects.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tollgate_core::{
    Clock, Decision, FailurePolicy, MemoryStore, Outcome, Policy, Store, StoreError, SystemClock,
};
use tollgate_http::headers::HeaderSet;
use tollgate_tower::{Verdict, Verdicts};

use crate::config::{Algorithm, Limit, RateLimitConfig, Unit, policy_of};
use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::plan::{LimitRef, Planned, PlannedLimit};
use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry as ProtoEntry;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as ProtoLimit, rate_limit::Unit as ProtoUnit,
};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService as RateLimitServiceTrait, RateLimitServiceServer,
};
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::proto::envoy::r#type::v3::RateLimitUnit;

impl crate::config::DescriptorEntry for ProtoEntry {
    fn key(&self) -> &str {
        &self.key
    }
    fn value(&self) -> &str {
        &self.value
    }
}

/// What a store error makes of a descriptor's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnStoreError {
    /// Answer the call with gRPC `UNAVAILABLE`, so that Envoy's `failure_mode_deny` decides (as
    /// envoyproxy/ratelimit does).
    #[default]
    Error,
    /// Decide by tollgate's failure policy: admit (`open`), refuse (`closed`) or decide on an in-process store
    /// (`local`).
    Policy(FailurePolicy),
}

/// How the service answers, beside its configuration and store.
#[derive(Debug, Clone)]
#[must_use]
pub struct Options {
    pub(crate) headers: HeaderSet,
    pub(crate) shadow_mode: bool,
    pub(crate) on_store_error: OnStoreError,
    pub(crate) algorithm: Algorithm,
    pub(crate) all_or_nothing: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            headers: HeaderSet::NONE,
            shadow_mode: false,
            on_store_error: OnStoreError::Error,
            algorithm: crate::config::DEFAULT_ALGORITHM,
            all_or_nothing: false,
        }
    }
}

impl Options {
    /// No response headers, no global shadow mode, store errors answered as errors.
    pub fn new() -> Self {
        Self::default()
    }

    /// Which rate-limit header fields to send in `response_headers_to_add` (none by default): the IETF
    /// `RateLimit-Policy` / `RateLimit` fields and the `X-RateLimit-*` ones, for the descriptors that were decided.
    pub const fn headers(mut self, headers: HeaderSet) -> Self {
        self.headers = headers;
        self
    }

    /// Every answer `OK`, what would have been refused still counted (envoyproxy/ratelimit's `SHADOW_MODE`).
    pub const fn shadow_mode(mut self, on: bool) -> Self {
        self.shadow_mode = on;
        self
    }

    /// What a store error makes of a descriptor's decision.
    pub const fn on_store_error(mut self, on: OnStoreError) -> Self {
        self.on_store_error = on;
        self
    }

    /// A refused request spends nothing: when the answer is `OVER_LIMIT`, every descriptor that admitted it gets
    /// its hits back before the answer leaves (a refund dated at the decision, exact for the token bucket and the
    /// sliding window; a fixed window's count stays). Off by default, as in envoyproxy/ratelimit, which counts
    /// every descriptor's hits whatever the others answer.
    pub const fn all_or_nothing(mut self, on: bool) -> Self {
        self.all_or_nothing = on;
        self
    }

    /// The algorithm of the limits Envoy sends in a descriptor (`limit`).
    pub const fn override_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }
}

/// The rate limit service: a tonic service of `envoy.service.ratelimit.v3.RateLimitService` over a store.
#[derive(Debug)]
pub struct RateLimitService<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for RateLimitService<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

#[derive(Debug)]
struct Inner<S> {
    engine: Engine<S>,
    config: Arc<ArcSwap<RateLimitConfig>>,
    options: Options,
    /// The failure policy `local`'s store.
    local: MemoryStore,
    metrics: Metrics,
    /// The clock of the answers the service makes itself (failure policies, `requests_per_unit: 0`).
    clock: SystemClock,
}

impl<S: Store> RateLimitService<S> {
    /// The service deciding on `store` by the configuration `config` holds (a reload swaps it).
    pub fn new(store: S, config: Arc<ArcSwap<RateLimitConfig>>, options: Options) -> Self {
        Self {
            inner: Arc::new(Inner {
                engine: Engine::new(store),
                config,
                options,
                local: MemoryStore::builder().name("tollgate-rls-local").build(),
                metrics: Metrics::new(),
                clock: SystemClock::new(),
            }),
        }
    }

    /// The tonic server of this service, to add to a `tonic::transport::Server`.
    pub fn into_server(self) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(self)
    }

    /// Answers one request.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` for a request without a domain or without descriptors, or with a limit override in an
    /// unknown unit; `UNAVAILABLE` when the store fails and [`OnStoreError::Error`] applies.
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        let inner = &*self.inner;
        let _in_flight = inner.metrics.in_flight();
        if request.domain.is_empty() {
            return Err(tonic::Status::invalid_argument(
                "rate limit domain must not be empty",
            ));
        }
        if request.descriptors.is_empty() {
            return Err(tonic::Status::invalid_argument(
                "rate limit descriptor list must not be empty",
            ));
        }
        let config = inner.config.load();
        let mut plan = Vec::with_capacity(request.descriptors.len());
        for descriptor in &request.descriptors {
            plan.push(self.plan(&config, &request.domain, descriptor, request.hits_addend)?);
        }
        // Limits named in another's `replaces` are dropped (the request is not counted against them).
        let replaced: Vec<Arc<Limit>> = plan
            .iter()
            .filter_map(|p| p.limit.as_ref())
            .filter(|l| !l.limit.replaces.is_empty())
            .map(|l| Arc::clone(&l.limit))
            .collect();
        if !replaced.is_empty() {
            for p in &mut plan {
                if p.limit.as_ref().is_some_and(|l| {
                    !l.limit.name.is_empty()
                        && replaced.iter().any(|r| r.replaces.contains(&l.limit.name))
                }) {
                    p.limit = None;
                }
            }
        }
        let together = inner.options.all_or_nothing && !inner.options.shadow_mode;
        let decisions = inner.engine.decide_all(&plan, together).await;
        let as_one = decisions.as_one;
        // Each limited descriptor's decision, and whether the store made it (a failure policy's decision spent
        // nothing there to give back).
        let mut decided: Vec<Option<(Decision, bool)>> = Vec::with_capacity(plan.len());
        for (p, result) in plan.iter().zip(decisions.results) {
            let Some(planned) = p.limit.as_ref().filter(|l| !l.limit.unlimited) else {
                decided.push(None);
                continue;
            };
            decided.push(Some(match result {
                Some(Ok(decision)) => (decision, true),
                Some(Err(e)) => match self.on_error(planned, &e).await {
                    Some(decision) => (decision, false),
                    None => {
                        return Err(tonic::Status::unavailable(format!(
                            "the rate limit store failed: {e}"
                        )));
                    }
                },
                // `requests_per_unit: 0`: nothing is admitted.
                None => (refused(planned, inner.clock.now()), false),
            }));
        }
        let (mut over, mut quota_over, mut quota_total) = (0, 0, 0);
        for (p, d) in plan.iter().zip(&decided) {
            let (Some(planned), Some((decision, _))) = (&p.limit, d) else {
                continue;
            };
            let over_limit = !decision.is_allowed() && !planned.limit.shadow_mode;
            if planned.limit.quota_mode {
                quota_total += 1;
                quota_over += usize::from(over_limit);
            } else {
                over += usize::from(over_limit);
            }
        }
        let refused_request = over > 0 || (quota_total > 0 && quota_over == quota_total);
        if refused_request && together && !as_one {
            inner.engine.give_back(&plan, &mut decided).await;
        }
        let mut response = RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: Vec::with_capacity(plan.len()),
            response_headers_to_add: Vec::new(),
        };
        let mut verdicts = Verdicts::default();
        for (p, d) in plan.iter().zip(decided) {
            let Some(planned) = &p.limit else {
                response.statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    ..DescriptorStatus::default()
                });
                continue;
            };
            let limit = &planned.limit;
            let Some((decision, _)) = d else {
                inner.metrics.allowed(planned);
                response.statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..DescriptorStatus::default()
                });
                continue;
            };
            let refused = !decision.is_allowed();
            inner.metrics.decided(planned, &decision);
            let shadow = limit.shadow_mode;
            let code = if refused && !shadow {
                Code::OverLimit
            } else {
                Code::Ok
            };
            let window = planned.window();
            let mut verdict = Verdict::new(limit.display_name(), window, decision);
            verdict.enforced = !shadow;
            response.statuses.push(DescriptorStatus {
                code: code as i32,
                current_limit: Some(ProtoLimit {
                    name: limit.name.clone(),
                    requests_per_unit: limit.requests_per_unit,
                    unit: limit.unit.map_or(ProtoUnit::Unknown, proto_unit) as i32,
                }),
                limit_remaining: u32::try_from(decision.remaining).unwrap_or(u32::MAX),
                duration_until_reset: Some(prost_types::Duration {
                    seconds: i64::try_from(verdict.reset_secs()).unwrap_or(i64::MAX),
                    nanos: 0,
                }),
            });
            if inner.options.headers != HeaderSet::NONE {
                verdicts.push(verdict);
            }
        }
        if refused_request {
            if inner.options.shadow_mode {
                inner.metrics.global_shadow();
            } else {
                response.overall_code = Code::OverLimit as i32;
            }
        }
        if inner.options.headers != HeaderSet::NONE {
            let mut headers = http::HeaderMap::new();
            inner.options.headers.render(&verdicts, &mut headers);
            response.response_headers_to_add = headers
                .iter()
                .filter_map(|(name, value)| {
                    Some(HeaderValue {
                        key: name.as_str().to_owned(),
                        value: value.to_str().ok()?.to_owned(),
                    })
                })
                .collect();
        }
        Ok(response)
    }

    /// The limit a descriptor is decided by, the key its counter lives under, and its cost.
    fn plan<'c>(
        &self,
        config: &'c RateLimitConfig,
        domain: &str,
        descriptor: &RateLimitDescriptor,
        hits_addend: u32,
    ) -> Result<Planned<'c>, tonic::Status> {
        let cost = descriptor
            .hits_addend
            .unwrap_or_else(|| u64::from(hits_addend.max(1)));
        if !config.domains.contains_key(domain) {
            self.inner.metrics.domain_not_found();
            return Ok(Planned { limit: None, cost });
        }
        if let Some(over) = &descriptor.limit {
            let limit =
                self.override_limit(domain, descriptor, over.requests_per_unit, over.unit)?;
            let key = store_key(domain, &descriptor.entries, |_, v| v, limit.policy.as_ref());
            return Ok(Planned {
                limit: Some(PlannedLimit {
                    stats_key: None,
                    key,
                    limit: LimitRef::Owned(Arc::new(limit)),
                }),
                cost,
            });
        }
        let Some(found) = config.find(domain, &descriptor.entries) else {
            return Ok(Planned { limit: None, cost });
        };
        let limit = found.limit();
        let key = store_key(
            domain,
            &descriptor.entries,
            |i, v| found.counted_value(i, v),
            limit.policy.as_ref(),
        );
        let stats_key = found
            .stats_key_is_detailed()
            .then(|| found.stats_key().to_owned());
        Ok(Planned {
            limit: Some(PlannedLimit {
                stats_key,
                key,
                limit: LimitRef::Config(limit),
            }),
            cost,
        })
    }

    /// The limit Envoy sent in the descriptor, in place of the configured one (never in shadow mode).
    fn override_limit(
        &self,
        domain: &str,
        descriptor: &RateLimitDescriptor,
        requests_per_unit: u32,
        unit: i32,
    ) -> Result<Limit, tonic::Status> {
        let unit = match RateLimitUnit::try_from(unit) {
            Ok(RateLimitUnit::Second) => Unit::Second,
            Ok(RateLimitUnit::Minute) => Unit::Minute,
            Ok(RateLimitUnit::Hour) => Unit::Hour,
            Ok(RateLimitUnit::Day) => Unit::Day,
            Ok(RateLimitUnit::Month) => Unit::Month,
            Ok(RateLimitUnit::Year) => Unit::Year,
            _ => {
                return Err(tonic::Status::invalid_argument(format!(
                    "the descriptor's limit override has no known unit ({unit})"
                )));
            }
        };
        let algorithm = self.inner.options.algorithm;
        let policy = policy_of(requests_per_unit, unit, algorithm)
            .map_err(tonic::Status::invalid_argument)?;
        let mut full_key = String::from(domain);
        for e in &descriptor.entries {
            full_key.push('.');
            full_key.push_str(&e.key);
            if !e.value.is_empty() {
                full_key.push('_');
                full_key.push_str(&e.value);
            }
        }
        Ok(Limit {
            requests_per_unit,
            unit: Some(unit),
            name: String::new(),
            replaces: Vec::new(),
            unlimited: false,
            shadow_mode: false,
            quota_mode: false,
            detailed_metric: false,
            algorithm,
            full_key: full_key.into(),
            policy,
            counters: std::sync::OnceLock::new(),
        })
    }

    /// The decision the failure policy makes for a store error (`None`: answer with an error).
    async fn on_error(&self, planned: &PlannedLimit<'_>, e: &StoreError) -> Option<Decision> {
        let inner = &*self.inner;
        let policy = planned.limit.policy.as_ref()?;
        let failure_policy = match inner.options.on_store_error {
            OnStoreError::Error => "error",
            OnStoreError::Policy(p) => p.as_str(),
        };
        inner.metrics.store_error(planned, e, failure_policy);
        match inner.options.on_store_error {
            OnStoreError::Error => None,
            OnStoreError::Policy(FailurePolicy::Local) => {
                inner.local.check(&planned.key, policy, 1).await.ok()
            }
            OnStoreError::Policy(failure) => failure.synthesize(policy, inner.clock.now()),
        }
    }
}

/// `requests_per_unit: 0`: a refusal with nothing remaining, until the unit's end.
fn refused(planned: &PlannedLimit<'_>, now: tollgate_core::Timestamp) -> Decision {
    let unit = planned
        .limit
        .unit
        .map_or(Duration::from_secs(1), Unit::duration);
    let unit_us = u64::try_from(unit.as_micros()).unwrap_or(u64::MAX);
    let end = now.as_micros() - now.as_micros() % unit_us + unit_us;
    Decision {
        outcome: Outcome::Limited,
        limit: 0,
        remaining: 0,
        reset: tollgate_core::Timestamp::from_micros(end),
        retry_after: Some(Duration::from_micros(end - now.as_micros())),
        now,
    }
}

const fn proto_unit(unit: Unit) -> ProtoUnit {
    match unit {
        Unit::Second => ProtoUnit::Second,
        Unit::Minute => ProtoUnit::Minute,
        Unit::Hour => ProtoUnit::Hour,
        Unit::Day => ProtoUnit::Day,
        Unit::Week => ProtoUnit::Week,
        Unit::Month => ProtoUnit::Month,
        Unit::Year => ProtoUnit::Year,
    }
}

/// The store key of a descriptor's counter: the domain and every entry, each part length-prefixed (so no two
/// descriptors share one whatever bytes they hold), and the limit's period (a limit sent by Envoy with another
/// unit counts apart).
fn store_key<'e>(
    domain: &str,
    entries: &'e [ProtoEntry],
    value: impl Fn(usize, &'e str) -> &'e str,
    policy: Option<&Policy>,
) -> String {
    use std::fmt::Write;
    let mut key = String::with_capacity(16 + domain.len() + entries.len() * 24);
    let _ = write!(key, "{}:{domain}", domain.len());
    for (i, e) in entries.iter().enumerate() {
        let v = value(i, &e.value);
        let _ = write!(key, "|{}:{}={}:{v}", e.key.len(), e.key, v.len());
    }
    if let Some(policy) = policy {
        let _ = write!(key, "|{}s", policy.quota().period().as_secs());
    }
    key
}

impl Limit {
    /// The name clients see in the RateLimit fields: the limit's `name`, else its configured path.
    fn display_name(&self) -> String {
        if self.name.is_empty() {
            self.full_key.to_string()
        } else {
            self.name.clone()
        }
    }
}

#[tonic::async_trait]
impl<S: Store> RateLimitServiceTrait for RateLimitService<S> {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        self.should_rate_limit(request.get_ref())
            .await
            .map(tonic::Response::new)
    }
}
