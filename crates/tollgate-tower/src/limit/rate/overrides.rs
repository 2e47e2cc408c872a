//! Per-key overrides and exemptions: plans, tenants, internal callers.
//!
//! An [`Overrides`] table names key values — as an operator writes them: `gold` for an API-key header, an address
//! or a network for a client IP (see [`KeyExtractor::match_key`]) — and gives each a plan: a policy of its own
//! ([`key`](Overrides::key), [`network`](Overrides::network)), or an exemption ([`exempt`](Overrides::exempt),
//! [`exempt_network`](Overrides::exempt_network)). A limiter with overrides looks the request's value up in a hash
//! table (networks: most specific first) through a reused buffer, so the lookup allocates nothing; a limiter
//! without any pays one branch.
//!
//! A key under an override policy has a bucket of its own, named by the limiter and the policy
//! (`<limiter>#<policy>:<key>`): changing a key's plan starts it afresh under the new policy, and an unchanged
//! plan keeps its state across a reload (the bucket's name is the same). An exempt request is passed on without a
//! store call and counted in `tollgate_decisions_total{limiter, outcome="exempt"}` (and a `tracing` event on
//! `tollgate::decision`): an exemption is never silent.
//!
//! ```
//! use std::sync::Arc;
//! use tollgate_core::{MemoryStore, Policy, Quota};
//! use tollgate_tower::{BoxError, KeyError, RateLimitLayer, Verdicts, VerdictSink};
//! use tollgate_tower::limit::rate::Overrides;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! #[derive(Debug, Default)]
//! struct Reply(Verdicts);
//! impl VerdictSink for Reply {
//!     fn verdicts_mut(&mut self) -> &mut Verdicts { &mut self.0 }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let by_user = |user: &&str, key: &mut String| {
//!     key.push_str(user);
//!     Ok::<_, KeyError>(())
//! };
//! let layer = RateLimitLayer::new(
//!     "per-user",
//!     Policy::token_bucket(Quota::per_minute(1)?),
//!     Arc::new(MemoryStore::new()),
//!     by_user,
//! )
//! .overrides(
//!     Overrides::new()
//!         .key("gold", Policy::token_bucket(Quota::per_minute(3)?))
//!         .exempt("internal"),
//! );
//! let mut svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_: &str| async { Ok::<_, BoxError>(Reply::default()) });
//!
//! // 5 requests each: the default allows 1 a minute, `gold` 3, `internal` is never limited.
//! for (user, expected) in [("ann", 1), ("gold", 3), ("internal", 5)] {
//!     let mut admitted = 0;
//!     for _ in 0..5 {
//!         if svc.ready().await?.call(user).await.is_ok() {
//!             admitted += 1;
//!         }
//!     }
//!     assert_eq!(admitted, expected, "{user}");
//! }
//! # Ok(())
//! # }
//! ```

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;

use metrics::Counter;
use tollgate_core::Policy;

use crate::observe::DECISIONS_TOTAL;
use crate::{ConfigError, KeyExtractor, Name};

/// What an override gives a key: a policy of its own, or no limit at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Plan {
    /// Decide the key with this policy, in a bucket of its own.
    Limit(Policy),
    /// Never limit the key (counted as `outcome="exempt"`).
    Exempt,
}

/// Per-key overrides and exemptions of one limiter: see the [module docs](self).
///
/// A value given twice keeps its last plan. An address matches its exact entry first, then the most specific
/// network that contains it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use]
pub struct Overrides {
    exact: Vec<(Box<[u8]>, Plan)>,
    networks: Vec<Network>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Network {
    addr: IpAddr,
    prefix: u8,
    plan: Plan,
}

impl Network {
    fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                net.to_bits() & mask == ip.to_bits() & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                net.to_bits() & mask == ip.to_bits() & mask
            }
            _ => false,
        }
    }
}

impl Overrides {
    /// No overrides.
    pub fn new() -> Self {
        Self::default()
    }

    /// Gives the key `value` the plan `plan`.
    fn plan(mut self, value: impl AsRef<[u8]>, plan: Plan) -> Self {
        let value: Box<[u8]> = value.as_ref().into();
        self.exact.retain(|(v, _)| *v != value);
        self.exact.push((value, plan));
        self
    }

    /// Decides the key `value` with `policy`, in a bucket of its own.
    pub fn key(self, value: impl AsRef<[u8]>, policy: Policy) -> Self {
        self.plan(value, Plan::Limit(policy))
    }

    /// Never limits the key `value`.
    pub fn exempt(self, value: impl AsRef<[u8]>) -> Self {
        self.plan(value, Plan::Exempt)
    }

    /// Decides every client address in `addr/prefix` with `policy`, each in a bucket of its own (for keys that
    /// are client addresses).
    ///
    /// # Errors
    /// A [`ConfigError`] if `prefix` is longer than the address (`/33` for IPv4, `/129` for IPv6).
    pub fn network(self, addr: IpAddr, prefix: u8, policy: Policy) -> Result<Self, ConfigError> {
        self.network_plan(addr, prefix, Plan::Limit(policy))
    }

    /// Never limits a client address in `addr/prefix` (for keys that are client addresses).
    ///
    /// # Errors
    /// A [`ConfigError`] if `prefix` is longer than the address (`/33` for IPv4, `/129` for IPv6).
    pub fn exempt_network(self, addr: IpAddr, prefix: u8) -> Result<Self, ConfigError> {
        self.network_plan(addr, prefix, Plan::Exempt)
    }

    fn network_plan(mut self, addr: IpAddr, prefix: u8, plan: Plan) -> Result<Self, ConfigError> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(ConfigError::new(format!(
                "{addr}/{prefix}: the prefix is longer than the address ({max} bits at most)"
            )));
        }
        let addr = addr.to_canonical();
        self.networks
            .retain(|n| (n.addr, n.prefix) != (addr, prefix));
        self.networks.push(Network { addr, prefix, plan });
        // Most specific first: the first network that contains an address is its plan.
        self.networks.sort_by_key(|n| std::cmp::Reverse(n.prefix));
        Ok(self)
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.networks.is_empty()
    }
}

/// The name of a bucket family under `policy`: `<limiter>#<policy>` (e.g. `api#tb6/10000000us/6`), the same on every
/// instance of a fleet.
pub(crate) fn policy_prefix(name: &str, policy: &Policy) -> Name {
    let quota = policy.quota();
    let algorithm = match policy.algorithm() {
        tollgate_core::Algorithm::TokenBucket => "tb",
        tollgate_core::Algorithm::FixedWindow => "fw",
        _ => "sw",
    };
    let mut prefix = format!(
        "{name}#{algorithm}{}/{}us/{}",
        quota.limit(),
        quota.period_micros(),
        quota.burst()
    );
    if policy.lockout_micros() > 0 {
        // A lockout is part of the policy: a key locked out under one must not carry it into another.
        prefix.push_str(&format!("/lock{}us", policy.lockout_micros()));
    }
    Name::from(prefix)
}

/// Where a request goes once its key's value is looked up.
pub(crate) enum Choice<T> {
    Use(T),
    Exempt,
}

/// The built table: each override's plan resolved to the limiter state `T` that decides it.
pub(crate) struct Plans<T> {
    exact: HashMap<Box<[u8]>, Choice<T>>,
    networks: Vec<(Network, Choice<T>)>,
    exempt: Counter,
}

impl<T: Clone> Plans<T> {
    /// Resolves `overrides` for the limiter `name`, each policy's state built once by `build`.
    pub(crate) fn new(
        name: &Name,
        overrides: &Overrides,
        mut build: impl FnMut(Policy) -> T,
    ) -> Self {
        let mut built: HashMap<Policy, T> = HashMap::new();
        let mut resolve = |plan: Plan| match plan {
            Plan::Exempt => Choice::Exempt,
            Plan::Limit(policy) => {
                Choice::Use(built.entry(policy).or_insert_with(|| build(policy)).clone())
            }
        };
        let exact = overrides
            .exact
            .iter()
            .map(|(value, plan)| (value.clone(), resolve(*plan)))
            .collect();
        let networks = overrides
            .networks
            .iter()
            .map(|n| (*n, resolve(n.plan)))
            .collect();
        Self {
            exact,
            networks,
            exempt: metrics::counter!(DECISIONS_TOTAL, "limiter" => name.to_string(), "outcome" => "exempt"),
        }
    }
}

impl<T> Plans<T> {
    /// The plan of the request's key (`None`: the limiter's own policy), looked up in a reused buffer.
    pub(crate) fn find<Req, K: KeyExtractor<Req>>(&self, key: &K, req: &Req) -> Option<&Choice<T>> {
        with_match_buffer(|value| {
            // A missing key is the limiter's to report, as it does without overrides.
            key.match_key(req, value).ok()?;
            if let Some(choice) = self.exact.get(value.as_slice()) {
                return Some(choice);
            }
            if self.networks.is_empty() {
                return None;
            }
            let ip: IpAddr = std::str::from_utf8(value).ok()?.parse().ok()?;
            self.networks
                .iter()
                .find(|(n, _)| n.contains(ip))
                .map(|(_, choice)| choice)
        })
    }

    /// Counts an exempt request.
    pub(crate) fn count_exempt(&self) {
        self.exempt.increment(1);
    }
}

thread_local! {
    static MATCH_BUFFER: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(64));
}

/// Runs `f` with an empty byte buffer: this thread's reused one, or a fresh one if it is in use or gone.
fn with_match_buffer<R>(mut f: impl FnMut(&mut Vec<u8>) -> R) -> R {
    let reused = MATCH_BUFFER.try_with(|cell| {
        let mut value = cell.try_borrow_mut().ok()?;
        value.clear();
        Some(f(&mut value))
    });
    match reused {
        Ok(Some(result)) => result,
        _ => f(&mut Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str, prefix: u8) -> Network {
        Network {
            addr: s.parse().unwrap(),
            prefix,
            plan: Plan::Exempt,
        }
    }

    #[test]
    fn networks_contain_their_addresses_only() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(net("10.0.0.0", 8).contains(ip("10.200.1.2")));
        assert!(!net("10.0.0.0", 8).contains(ip("11.0.0.1")));
        assert!(net("0.0.0.0", 0).contains(ip("1.2.3.4")));
        assert!(net("10.1.2.3", 32).contains(ip("10.1.2.3")));
        assert!(!net("10.1.2.3", 32).contains(ip("10.1.2.4")));
        assert!(net("2001:db8::", 32).contains(ip("2001:db8:1::7")));
        assert!(!net("2001:db8::", 32).contains(ip("2001:db9::1")));
        assert!(
            net("10.0.0.0", 8).contains(ip("::ffff:10.0.0.1")),
            "IPv4-mapped"
        );
        assert!(!net("10.0.0.0", 8).contains(ip("2001:db8::1")));
    }

    #[test]
    fn prefixes_longer_than_the_address_are_errors() {
        let err = Overrides::new()
            .exempt_network("10.0.0.0".parse().unwrap(), 33)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "10.0.0.0/33: the prefix is longer than the address (32 bits at most)"
        );
        assert!(
            Overrides::new()
                .exempt_network("::".parse().unwrap(), 128)
                .is_ok()
        );
    }

    #[test]
    fn the_last_plan_of_a_value_wins_and_networks_go_most_specific_first() {
        let one = Policy::token_bucket(tollgate_core::Quota::per_second(1).unwrap());
        let o = Overrides::new().key("a", one).exempt("a");
        assert_eq!(o.exact, vec![(Box::from(&b"a"[..]), Plan::Exempt)]);
        let o = Overrides::new()
            .exempt_network("10.0.0.0".parse().unwrap(), 8)
            .unwrap()
            .network("10.1.0.0".parse().unwrap(), 16, one)
            .unwrap();
        assert_eq!(o.networks[0].prefix, 16);
        assert_eq!(o.networks[0].plan, Plan::Limit(one));
    }

    #[test]
    fn policy_prefixes_name_the_policy() {
        let p = Policy::token_bucket(
            tollgate_core::Quota::new(6, std::time::Duration::from_secs(10))
                .unwrap()
                .with_burst(6)
                .unwrap(),
        );
        assert_eq!(&*policy_prefix("api", &p), "api#tb6/10000000us/6");
        let locked = p.with_lockout(std::time::Duration::from_secs(900)).unwrap();
        assert_eq!(
            &*policy_prefix("api", &locked),
            "api#tb6/10000000us/6/lock900000000us"
        );
    }
}
