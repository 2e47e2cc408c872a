//! From the file as written to the limiters it describes: the checks across fields, each error at its place.

use std::collections::HashSet;
use std::net::IpAddr;
use std::ops::Range;

use tollgate_core::{Algorithm, FailurePolicy, Policy, Quota};
use tollgate_http::HeaderSet;
use tollgate_http::key::Cidr;
use tollgate_tower::Mode;
use tollgate_tower::limit::rate::Overrides;
use toml::Spanned;

use crate::PolicyFileError;
use crate::schema::{FileSpec, KeyPart, LimiterSpec, OverrideSpec, Period};

/// A limiter as the file describes it, checked: what it takes to build one, and to tell whether a reload changed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Limiter {
    pub(crate) name: String,
    pub(crate) key: Vec<KeyPart>,
    pub(crate) policy: Policy,
    pub(crate) cost: u64,
    /// Where the real cost is read after the response, if it is charged then.
    pub(crate) cost_after: Option<tollgate_tower::CostAfter>,
    pub(crate) mode: Mode,
    pub(crate) on_store_error: FailurePolicy,
    pub(crate) routes: Vec<String>,
    pub(crate) methods: Vec<String>,
    pub(crate) overrides: Overrides,
}

/// The file's settings beside its limiters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub(crate) trusted_proxies: Vec<Cidr>,
    pub(crate) headers: HeaderSet,
    pub(crate) limiters: Vec<Limiter>,
}

/// Reports problems at their places in `text`, the contents of `origin`.
pub(crate) struct Places<'a> {
    pub(crate) origin: &'a str,
    pub(crate) text: &'a str,
}

impl Places<'_> {
    fn at(&self, span: Range<usize>, message: impl Into<String>) -> PolicyFileError {
        PolicyFileError::at(self.origin, self.text, Some(span), message)
    }
}

pub(crate) fn resolve(spec: FileSpec, places: &Places<'_>) -> Result<Resolved, PolicyFileError> {
    let trusted_proxies = spec
        .trusted_proxies
        .iter()
        .map(|cidr| {
            cidr.get_ref()
                .parse::<Cidr>()
                .map_err(|e| places.at(cidr.span(), e.to_string()))
        })
        .collect::<Result<_, _>>()?;
    let headers = match &spec.headers {
        None => HeaderSet::ALL,
        Some(list) => {
            let mut set = HeaderSet::NONE;
            for family in list.get_ref() {
                set = set.union(match family.get_ref().as_str() {
                    "ietf" => HeaderSet::IETF,
                    "ratelimit" => HeaderSet::RATELIMIT_ONLY,
                    "github" => HeaderSet::GITHUB,
                    "all" => HeaderSet::ALL,
                    "none" => HeaderSet::NONE,
                    other => {
                        return Err(places.at(
                            family.span(),
                            format!("unknown header family {other:?}: expected ietf, ratelimit, github, all or none"),
                        ));
                    }
                });
            }
            set
        }
    };
    let mut names = HashSet::new();
    let mut limiters = Vec::with_capacity(spec.limiters.len());
    for limiter in spec.limiters {
        let name = limiter.name.get_ref();
        if name.is_empty()
            || name.contains(['#', ':', '{', '}'])
            || name.chars().any(char::is_control)
        {
            return Err(places.at(
                limiter.name.span(),
                format!("{name:?}: a limiter name is not empty and has no #, :, braces or control characters"),
            ));
        }
        if !names.insert(name.clone()) {
            return Err(places.at(
                limiter.name.span(),
                format!("a second limiter named {name:?}: names are unique"),
            ));
        }
        limiters.push(resolve_limiter(limiter, places)?);
    }
    Ok(Resolved {
        trusted_proxies,
        headers,
        limiters,
    })
}

fn resolve_limiter(spec: LimiterSpec, places: &Places<'_>) -> Result<Limiter, PolicyFileError> {
    let algorithm = spec
        .algorithm
        .as_ref()
        .map_or(Algorithm::TokenBucket, |a| a.get_ref().0);
    let policy = policy(
        algorithm,
        spec.algorithm.as_ref().map(Spanned::span),
        &spec.limit,
        &spec.period,
        spec.burst.as_ref(),
        spec.lockout.as_ref(),
        places,
    )?;
    let cost = match &spec.cost {
        None => 1,
        Some(cost) if *cost.get_ref() > policy.max_cost() => {
            return Err(places.at(
                cost.span(),
                format!(
                    "a cost of {} is more than the policy ever allows at once ({})",
                    cost.get_ref(),
                    policy.max_cost()
                ),
            ));
        }
        Some(cost) => *cost.get_ref(),
    };
    let key = spec.key.get_ref().0.clone();
    let by_address = key == [KeyPart::ClientIp];
    let mut overrides = Overrides::new();
    for value in &spec.exempt {
        overrides = plan(overrides, value, None, by_address, places)?;
    }
    for o in &spec.overrides {
        let plan_policy = override_policy(o, algorithm, &spec, places)?;
        overrides = plan(overrides, &o.key, Some(plan_policy), by_address, places)?;
    }
    let routes = paths(&spec.routes, "route", places)?;
    let methods = paths(&spec.methods, "gRPC method", places)?;
    Ok(Limiter {
        name: spec.name.into_inner(),
        key,
        policy,
        cost,
        cost_after: spec.cost_after.map(|c| c.into_inner().0),
        mode: spec.mode.map_or(Mode::Enforce, |m| m.0),
        on_store_error: spec.on_store_error.map_or(FailurePolicy::Local, |f| f.0),
        routes,
        methods,
        overrides,
    })
}

fn override_policy(
    o: &OverrideSpec,
    algorithm: tollgate_core::Algorithm,
    limiter: &LimiterSpec,
    places: &Places<'_>,
) -> Result<Policy, PolicyFileError> {
    let (algorithm, algorithm_span) = match &o.algorithm {
        Some(a) => (a.get_ref().0, Some(a.span())),
        None => (algorithm, None),
    };
    let period = o.period.as_ref().unwrap_or(&limiter.period);
    let lockout = o.lockout.as_ref().or(limiter.lockout.as_ref());
    policy(
        algorithm,
        algorithm_span,
        &o.limit,
        period,
        o.burst.as_ref(),
        lockout,
        places,
    )
}

fn policy(
    algorithm: Algorithm,
    algorithm_span: Option<Range<usize>>,
    limit: &Spanned<u64>,
    period: &Spanned<Period>,
    burst: Option<&Spanned<u64>>,
    lockout: Option<&Spanned<Period>>,
    places: &Places<'_>,
) -> Result<Policy, PolicyFileError> {
    let quota = Quota::new(*limit.get_ref(), period.get_ref().0)
        .map_err(|e| places.at(limit.span(), e.to_string()))?;
    let quota = match burst {
        Some(burst)
            if algorithm == Algorithm::SlidingWindowCounter
                && burst.get_ref() != limit.get_ref() =>
        {
            return Err(places.at(
                burst.span(),
                "burst applies to the token-bucket algorithm only",
            ));
        }
        Some(burst) => quota
            .with_burst(*burst.get_ref())
            .map_err(|e| places.at(burst.span(), e.to_string()))?,
        None => quota,
    };
    let policy = Policy::new(algorithm, quota)
        .map_err(|e| places.at(algorithm_span.unwrap_or(limit.span()), e.to_string()))?;
    match lockout {
        None => Ok(policy),
        Some(lockout) => policy
            .with_lockout(lockout.get_ref().0)
            .map_err(|e| places.at(lockout.span(), e.to_string())),
    }
}

/// Adds `value`'s plan, its own policy or (`None`) an exemption: an address or a network for a key that is the
/// client address, any text otherwise.
fn plan(
    overrides: Overrides,
    value: &Spanned<String>,
    plan: Option<Policy>,
    by_address: bool,
    places: &Places<'_>,
) -> Result<Overrides, PolicyFileError> {
    let text = value.get_ref();
    if text.is_empty() {
        return Err(places.at(value.span(), "an empty key value"));
    }
    if !by_address {
        return Ok(match plan {
            Some(policy) => overrides.key(text, policy),
            None => overrides.exempt(text),
        });
    }
    let expected = || {
        places.at(
            value.span(),
            format!(
                "{text:?}: expected an address or a CIDR such as 10.0.0.0/8 (the key is client-ip)"
            ),
        )
    };
    let (addr, prefix) = match text.split_once('/') {
        Some((addr, prefix)) => (addr, Some(prefix.parse::<u8>().map_err(|_| expected())?)),
        None => (text.as_str(), None),
    };
    let addr: IpAddr = addr.parse().map_err(|_| expected())?;
    let prefix = prefix.unwrap_or(if addr.is_ipv4() { 32 } else { 128 });
    match plan {
        Some(policy) => overrides.network(addr, prefix, policy),
        None => overrides.exempt_network(addr, prefix),
    }
    .map_err(|e| places.at(value.span(), e.to_string()))
}

fn paths(
    list: &[Spanned<String>],
    what: &str,
    places: &Places<'_>,
) -> Result<Vec<String>, PolicyFileError> {
    list.iter()
        .map(|path| {
            let text = path.get_ref();
            let body = text.strip_suffix('*').unwrap_or(text);
            if !text.starts_with('/') || body.contains('*') {
                return Err(places.at(
                    path.span(),
                    format!("{text:?}: a {what} is a path from /, with at most one * at its end (a prefix)"),
                ));
            }
            Ok(text.clone())
        })
        .collect()
}
