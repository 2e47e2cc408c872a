//! Request priorities: which traffic load shedders drop first.
//!
//! Four classes in Stripe's order, from the traffic kept longest to the traffic shed first:
//! [`Critical`](Priority::Critical) (e.g. creating charges), [`High`](Priority::High) (other writes),
//! [`Normal`](Priority::Normal) (reads) and [`Low`](Priority::Low) (test-mode or batch traffic). A [`Classify`]
//! implementation, supplied by the user, gives each request its class; the HTTP adapter ships a method-based one.
//! A closure `Fn(&Req) -> Priority` classifies, and a `Priority` is the same class for every request.
//!
//! ```
//! use tollgate_tower::{Classify, Priority};
//!
//! struct Req { path: &'static str }
//! let by_path = |req: &Req| {
//!     if req.path.starts_with("/v1/charges") { Priority::Critical } else { Priority::Normal }
//! };
//! assert_eq!(by_path.classify(&Req { path: "/v1/charges" }), Priority::Critical);
//! assert_eq!(Priority::Low.classify(&Req { path: "/" }), Priority::Low);
//! assert_eq!("high".parse::<Priority>()?, Priority::High);
//! assert!(Priority::Critical.outranks(Priority::Low));
//! # Ok::<(), tollgate_tower::ConfigError>(())
//! ```

use std::fmt;
use std::str::FromStr;

use crate::ConfigError;

/// A request's class, from the most important ([`Critical`](Self::Critical)) to the least ([`Low`](Self::Low)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Priority {
    /// Traffic that must keep flowing, e.g. creating charges: shed last, and the only class allowed into the
    /// fleet's reserved capacity.
    Critical,
    /// Other writes (e.g. `POST`).
    High,
    /// Reads (e.g. `GET`): the default.
    #[default]
    Normal,
    /// Test-mode or batch traffic: shed first.
    Low,
}

impl Priority {
    /// Every class, most important first.
    pub const ALL: [Self; 4] = [Self::Critical, Self::High, Self::Normal, Self::Low];

    /// Position in [`ALL`](Self::ALL): 0 for `Critical` … 3 for `Low`.
    #[must_use]
    pub const fn index(self) -> usize {
        match self {
            Self::Critical => 0,
            Self::High => 1,
            Self::Normal => 2,
            Self::Low => 3,
        }
    }

    /// Whether `self` is kept longer than `other` under load.
    #[must_use]
    pub const fn outranks(self, other: Self) -> bool {
        self.index() < other.index()
    }

    /// A short stable name (`critical`, `high`, `normal`, `low`) for headers, metrics and logs.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Critical => "critical",
            Self::High => "high",
            Self::Normal => "normal",
            Self::Low => "low",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Priority {
    type Err = ConfigError;

    /// Parses `critical`, `high`, `normal` or `low`, ignoring ASCII case and surrounding spaces; anything else is
    /// a [`ConfigError`] naming what was given.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        Self::ALL
            .into_iter()
            .find(|p| t.eq_ignore_ascii_case(p.as_str()))
            .ok_or_else(|| {
                ConfigError::new(format!(
                    "unknown priority {s:?}: expected critical, high, normal or low"
                ))
            })
    }
}

/// Gives a request its [`Priority`].
pub trait Classify<Req>: Send + Sync + 'static {
    /// The class of `req`.
    fn classify(&self, req: &Req) -> Priority;
}

/// The same class for every request.
impl<Req> Classify<Req> for Priority {
    fn classify(&self, _: &Req) -> Priority {
        *self
    }
}

/// A classifier from a closure.
impl<Req, F> Classify<Req> for F
where
    F: Fn(&Req) -> Priority + Send + Sync + 'static,
{
    fn classify(&self, req: &Req) -> Priority {
        self(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_order_is_stripes() {
        for p in Priority::ALL {
            assert_eq!(p.as_str().parse::<Priority>().unwrap(), p);
            assert_eq!(p.as_str().to_uppercase().parse::<Priority>().unwrap(), p);
        }
        assert!(Priority::Critical.outranks(Priority::High));
        assert!(Priority::High.outranks(Priority::Normal));
        assert!(Priority::Normal.outranks(Priority::Low));
        assert!(!Priority::Low.outranks(Priority::Low));
        let err = "urgent".parse::<Priority>().unwrap_err();
        assert!(err.to_string().contains("critical, high, normal or low"));
    }
}
