//! The shared decision vectors: `tests/vectors/decisions.json` at the workspace root.
//!
//! Each case is a policy and a sequence of requests at explicit instants, with the decision every store must
//! return. The same file runs against `MemoryStore` and `RedisStore`: that is how "identical decisions for
//! identical inputs" is checked rather than hoped for.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use tollgate_core::{Algorithm, Decision, Outcome, Policy, Quota, Timestamp};

/// Every case in the file.
#[derive(Debug, Deserialize)]
pub struct Vectors {
    /// The cases.
    pub cases: Vec<Case>,
}

/// One policy and the requests it decides.
#[derive(Debug, Deserialize)]
pub struct Case {
    /// What the case checks.
    pub name: String,
    /// `token_bucket`, `sliding_window` or `fixed_window`.
    pub algorithm: String,
    /// Requests per period.
    pub limit: u64,
    /// The period in microseconds.
    pub period_us: u64,
    /// Token bucket capacity (defaults to `limit`).
    #[serde(default)]
    pub burst: Option<u64>,
    /// The lockout after a denial, µs (absent: none; see `Policy::with_lockout`).
    #[serde(default)]
    pub lockout_us: Option<u64>,
    /// The requests, in order.
    pub steps: Vec<Step>,
}

/// One request and the decision expected for it.
#[derive(Debug, Deserialize)]
pub struct Step {
    /// When the request arrives, µs since the epoch.
    pub at_us: u64,
    /// The client key.
    pub key: String,
    /// Tokens the request takes.
    pub cost: u64,
    /// `allowed`, `limited` or `cost_exceeds_capacity`.
    pub outcome: String,
    /// Expected `remaining`.
    pub remaining: u64,
    /// Expected `reset`, µs since the epoch.
    pub reset_us: u64,
    /// Expected `retry_after` in µs (absent unless limited).
    #[serde(default)]
    pub retry_after_us: Option<u64>,
    /// A peek (`Store::peek`): the decision a request would get, with nothing written.
    #[serde(default)]
    pub peek: bool,
    /// A charge after the response (`Store::charge`, a refund if negative) instead of a request; its decision is
    /// what a request of cost 0 gets right after.
    #[serde(default)]
    pub charge: Option<i64>,
    /// For a charge: when its request was decided, µs since the epoch.
    #[serde(default)]
    pub decided_at_us: Option<u64>,
}

impl Vectors {
    /// Loads the workspace's vector file.
    ///
    /// # Panics
    /// When the file is missing or malformed: a test cannot go on without its data.
    #[must_use]
    pub fn load() -> Self {
        let path = Self::path();
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("malformed {}: {e}", path.display()))
    }

    /// Where the vector file lives.
    #[must_use]
    pub fn path() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors/decisions.json")
    }
}

impl Case {
    /// The case's policy.
    ///
    /// # Panics
    /// When the case describes an invalid policy (a broken vector file).
    #[must_use]
    pub fn policy(&self) -> Policy {
        policy_of(
            &self.name,
            &self.algorithm,
            self.limit,
            self.period_us,
            self.burst,
            self.lockout_us,
        )
    }
}

/// The policy a vector case describes (the fields [`Case`] and [`LeaseCase`] share).
fn policy_of(
    name: &str,
    algorithm: &str,
    limit: u64,
    period_us: u64,
    burst: Option<u64>,
    lockout_us: Option<u64>,
) -> Policy {
    let quota = Quota::new(limit, Duration::from_micros(period_us))
        .and_then(|q| q.with_burst(burst.unwrap_or(limit)))
        .unwrap_or_else(|e| panic!("case {name}: {e}"));
    let algorithm = match algorithm {
        "token_bucket" => Algorithm::TokenBucket,
        "sliding_window" => Algorithm::SlidingWindowCounter,
        "fixed_window" => Algorithm::FixedWindow,
        other => panic!("case {name}: unknown algorithm {other}"),
    };
    Policy::new(algorithm, quota)
        .and_then(|p| p.with_lockout(Duration::from_micros(lockout_us.unwrap_or(0))))
        .unwrap_or_else(|e| panic!("case {name}: {e}"))
}

impl Step {
    /// The request's instant.
    #[must_use]
    pub const fn at(&self) -> Timestamp {
        Timestamp::from_micros(self.at_us)
    }

    /// For a charge: when its request was decided.
    #[must_use]
    pub fn decided_at(&self) -> Timestamp {
        Timestamp::from_micros(self.decided_at_us.unwrap_or(self.at_us))
    }

    /// The expected decision.
    ///
    /// # Panics
    /// On an unknown outcome name (a broken vector file).
    #[must_use]
    pub fn expected(&self, policy: &Policy) -> Decision {
        let outcome = match self.outcome.as_str() {
            "allowed" => Outcome::Allowed,
            "limited" => Outcome::Limited,
            "cost_exceeds_capacity" => Outcome::CostExceedsCapacity,
            other => panic!("unknown outcome {other}"),
        };
        Decision {
            outcome,
            limit: policy.quota().burst(),
            remaining: self.remaining,
            reset: Timestamp::from_micros(self.reset_us),
            retry_after: self.retry_after_us.map(Duration::from_micros),
            now: self.at(),
        }
    }
}

/// The token lease vectors: `tests/vectors/leases.json` (written by `tests/vectors/generate_leases.py`), plain
/// requests and lease calls of several instances mixed, with what every store must answer.
#[derive(Debug, Deserialize)]
pub struct LeaseVectors {
    /// The cases.
    pub cases: Vec<LeaseCase>,
}

/// One policy and the calls made on its one key.
#[derive(Debug, Deserialize)]
pub struct LeaseCase {
    /// What the case checks.
    pub name: String,
    /// `token_bucket` or `sliding_window`.
    pub algorithm: String,
    /// Requests per period.
    pub limit: u64,
    /// The period in microseconds.
    pub period_us: u64,
    /// Token bucket capacity (defaults to `limit`).
    #[serde(default)]
    pub burst: Option<u64>,
    /// The lockout a denial starts, µs (none when absent).
    #[serde(default)]
    pub lockout_us: Option<u64>,
    /// The calls, in order.
    pub steps: Vec<LeaseStep>,
}

/// One call and its expected answer.
#[derive(Debug, Deserialize)]
pub struct LeaseStep {
    /// `check` (a plain request) or `lease`.
    pub op: String,
    /// When the call is made, µs since the epoch.
    pub at_us: u64,
    /// A plain request's cost.
    #[serde(default)]
    pub cost: u64,
    /// A lease call's instance.
    #[serde(default)]
    pub instance: u64,
    /// A lease call's number.
    #[serde(default)]
    pub seq: u64,
    /// Tokens or slots wanted.
    #[serde(default)]
    pub want: u64,
    /// What the instance reports left.
    #[serde(default)]
    pub unspent: u64,
    /// The window the unspent slots were granted in (sliding window).
    #[serde(default)]
    pub window_start_us: u64,
    /// The lease's lifetime.
    #[serde(default)]
    pub ttl_us: u64,
    /// Whether the call ends the lease.
    #[serde(default)]
    pub end: bool,
    /// The expected answer's fields.
    pub expect: serde_json::Map<String, serde_json::Value>,
}

impl LeaseVectors {
    /// Loads the workspace's lease vector file.
    ///
    /// # Panics
    /// When the file is missing or malformed.
    #[must_use]
    pub fn load() -> Self {
        let path =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors/leases.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("malformed {}: {e}", path.display()))
    }
}

impl LeaseCase {
    /// The case's policy.
    ///
    /// # Panics
    /// When the case describes an invalid policy.
    #[must_use]
    pub fn policy(&self) -> Policy {
        policy_of(
            &self.name,
            &self.algorithm,
            self.limit,
            self.period_us,
            self.burst,
            self.lockout_us,
        )
    }
}

impl LeaseStep {
    fn field(&self, name: &str) -> Option<u64> {
        self.expect.get(name).and_then(serde_json::Value::as_u64)
    }

    /// The call's instant.
    #[must_use]
    pub const fn at(&self) -> Timestamp {
        Timestamp::from_micros(self.at_us)
    }

    /// Whether this is a lease call (else a plain request).
    #[must_use]
    pub fn is_lease(&self) -> bool {
        self.op == "lease"
    }

    /// The lease call.
    #[must_use]
    pub fn request(&self) -> tollgate_core::token_lease::TokenLeaseRequest {
        tollgate_core::token_lease::TokenLeaseRequest {
            instance: self.instance,
            seq: self.seq,
            want: self.want,
            unspent: self.unspent,
            window_start: self.window_start_us,
            ttl: Duration::from_micros(self.ttl_us),
            end: self.end,
        }
    }

    /// The plain request's expected decision.
    ///
    /// # Panics
    /// On a malformed step.
    #[must_use]
    pub fn expected_decision(&self, policy: &Policy) -> Decision {
        let outcome = self.expect["outcome"].as_str().unwrap_or_default();
        Step {
            at_us: self.at_us,
            key: String::new(),
            cost: self.cost,
            outcome: outcome.to_owned(),
            remaining: self.field("remaining").expect("remaining"),
            reset_us: self.field("reset_us").expect("reset_us"),
            retry_after_us: self.field("retry_after_us"),
            peek: false,
            charge: None,
            decided_at_us: None,
        }
        .expected(policy)
    }

    /// The lease call's expected grant.
    ///
    /// # Panics
    /// On a malformed step.
    #[must_use]
    pub fn expected_grant(&self) -> tollgate_core::token_lease::TokenLeaseGrant {
        let get = |name: &str| self.field(name).unwrap_or_else(|| panic!("{name}"));
        tollgate_core::token_lease::TokenLeaseGrant {
            granted: get("granted"),
            remaining: get("remaining"),
            reset: Timestamp::from_micros(get("reset_us")),
            retry_after: self.field("retry_after_us").map(Duration::from_micros),
            now: self.at(),
            expires: Timestamp::from_micros(get("expires_us")),
            window_start: get("window_start_us"),
            stale: self.expect["stale"].as_bool().unwrap_or_default(),
            held: get("held"),
        }
    }
}
