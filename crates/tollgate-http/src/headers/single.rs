//! The common case — one enforced limiter — rendered with a single allocation per response.
//!
//! Per response only three numbers change (remaining, reset, used): they are formatted side by side into one
//! inline buffer that becomes one shared [`Bytes`], which every per-response field slices. The fields that never
//! change are interned `'static` values, so cloning them per response costs nothing.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue};
use tollgate_tower::Verdict;
use tollgate_tower::verdict::{push_sf_string, visible_char};

use super::{
    HeaderSet, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
    X_RATELIMIT_RESET, X_RATELIMIT_RESOURCE, X_RATELIMIT_USED, push_u64,
};

/// Room for `"<name>";r=<u64>;t=<u64>` and three more `u64`s; a longer name takes the general path.
const INLINE: usize = 192;
const MAX_DIGITS: usize = 20;

/// The fields of one limiter that never change, computed once per layer.
#[derive(Debug)]
pub(crate) struct Constant {
    limiter: Arc<str>,
    limit: u64,
    window_secs: u64,
    policy: HeaderValue,
    limit_value: HeaderValue,
    resource: HeaderValue,
    /// `"<name>";r=`: the start of the `RateLimit` value.
    state_prefix: Box<[u8]>,
}

impl Constant {
    /// The constant fields of `v`'s limiter; `None` when its name is too long for the inline buffer.
    pub(crate) fn of(v: &Verdict) -> Option<Self> {
        let mut policy = String::with_capacity(64);
        push_sf_string(&mut policy, &v.limiter);
        let mut state_prefix = policy.clone().into_bytes();
        state_prefix.extend_from_slice(b";r=");
        if state_prefix.len() + 3 + 4 * MAX_DIGITS > INLINE {
            return None;
        }
        policy.push_str(";q=");
        push_u64(&mut policy, v.decision.limit);
        policy.push_str(";w=");
        push_u64(&mut policy, v.window_secs());
        let resource: String = v.limiter.chars().map(visible_char).collect();
        let mut limit = String::new();
        push_u64(&mut limit, v.decision.limit);
        Some(Self {
            limiter: v.limiter.clone(),
            limit: v.decision.limit,
            window_secs: v.window_secs(),
            policy: interned(&policy)?,
            limit_value: interned(&limit)?,
            resource: interned(&resource)?,
            state_prefix: state_prefix.into_boxed_slice(),
        })
    }

    /// Whether these constants describe `v`'s limiter.
    pub(crate) fn describes(&self, v: &Verdict) -> bool {
        Arc::ptr_eq(&self.limiter, &v.limiter)
            && self.limit == v.decision.limit
            && self.window_secs == v.window_secs()
    }
}

/// A header value that lives as long as the process, so a response can carry it without a reference count.
///
/// Each distinct value is kept once, however many layers ask for it: the values are limiter names and limits
/// from the configuration, so the set stays as small as the configuration.
fn interned(value: &str) -> Option<HeaderValue> {
    // Checked first: `from_static` would panic on a byte a header cannot carry.
    HeaderValue::from_str(value).ok()?;
    static INTERNED: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut set = INTERNED.lock().unwrap_or_else(PoisonError::into_inner);
    let value = match set.get(value) {
        Some(kept) => *kept,
        None => {
            let kept: &'static str = Box::leak(value.into());
            set.insert(kept);
            kept
        }
    };
    Some(HeaderValue::from_static(value))
}

/// The per-response values, side by side: the one allocation every per-response field shares.
struct Scratch {
    len: usize,
    bytes: [u8; INLINE],
}

impl AsRef<[u8]> for Scratch {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl Scratch {
    fn push(&mut self, s: &[u8]) -> Option<Range<usize>> {
        let start = self.len;
        let end = start.checked_add(s.len())?;
        self.bytes.get_mut(start..end)?.copy_from_slice(s);
        self.len = end;
        Some(start..end)
    }

    fn push_u64(&mut self, n: u64) -> Option<Range<usize>> {
        let mut digits = [0u8; MAX_DIGITS];
        self.push(format_u64(n, &mut digits))
    }
}

/// `n` in decimal, written at the end of `digits`.
pub(super) fn format_u64(mut n: u64, digits: &mut [u8; MAX_DIGITS]) -> &[u8] {
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &digits[i..];
        }
    }
}

impl HeaderSet {
    /// Renders `v` with `constant`; `None` (nothing written) if the values do not fit the inline buffer.
    pub(super) fn render_single(
        self,
        v: &Verdict,
        constant: &Constant,
        headers: &mut HeaderMap,
    ) -> Option<()> {
        let mut s = Scratch {
            len: 0,
            bytes: [0; INLINE],
        };
        // `RateLimit: "<name>";r=<remaining>;t=<reset>`; X-RateLimit-Remaining slices its `r` when both are on.
        let (state, mut remaining) = if self.ietf {
            let start = s.push(&constant.state_prefix)?.start;
            let remaining = s.push_u64(v.decision.remaining)?;
            s.push(b";t=")?;
            let end = s.push_u64(v.reset_secs())?.end;
            (Some(start..end), Some(remaining))
        } else {
            (None, None)
        };
        let numbers = if self.github {
            let remaining = match remaining.take() {
                Some(r) => r,
                None => s.push_u64(v.decision.remaining)?,
            };
            let reset = s.push_u64(v.decision.reset.as_secs_ceil())?;
            let used = s.push_u64(v.used())?;
            Some([remaining, reset, used])
        } else {
            None
        };
        let bytes = Bytes::from_owner(s);
        // Every byte is a digit or came from a valid constant: conversion cannot fail, and skipping beats panicking.
        let value = |range: Range<usize>| HeaderValue::from_maybe_shared(bytes.slice(range)).ok();
        headers.reserve(self.fields());
        if let Some(state) = state {
            headers.insert(RATELIMIT_POLICY, constant.policy.clone());
            if let Some(state) = value(state) {
                headers.insert(RATELIMIT, state);
            }
        }
        if let Some([remaining, reset, used]) = numbers {
            headers.insert(X_RATELIMIT_LIMIT, constant.limit_value.clone());
            for (name, range) in [
                (X_RATELIMIT_REMAINING, remaining),
                (X_RATELIMIT_RESET, reset),
                (X_RATELIMIT_USED, used),
            ] {
                if let Some(value) = value(range) {
                    headers.insert(name, value);
                }
            }
            headers.insert(X_RATELIMIT_RESOURCE, constant.resource.clone());
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;
    use std::time::Duration;

    use http::HeaderMap;
    use tollgate_core::{Decision, Outcome, Timestamp};
    use tollgate_tower::{Verdict, Verdicts};

    use super::Constant;
    use crate::HeaderSet;

    fn verdict(name: &str, outcome: Outcome, limit: u64, remaining: u64) -> Verdict {
        Verdict::new(
            name,
            Duration::from_millis(1_500),
            Decision {
                outcome,
                limit,
                remaining,
                reset: Timestamp::from_micros(1_700_000_003_000_001),
                retry_after: Some(Duration::from_millis(700)),
                now: Timestamp::from_micros(1_700_000_000_000_000),
            },
        )
    }

    fn sorted(headers: &HeaderMap) -> Vec<(String, String)> {
        let mut fields: Vec<_> = headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        fields.sort();
        fields
    }

    /// The cached single-limiter path writes exactly what the general path writes, for every header set, allowed
    /// or denied, with names that need escaping, extreme numbers, and a name too long for the inline buffer.
    #[test]
    fn single_limiter_path_matches_the_general_path() {
        let long = "n".repeat(300);
        let cases = [
            verdict("api", Outcome::Allowed, 100, 98),
            verdict("api", Outcome::Limited, 100, 0),
            verdict("say \"hi\" \\ é", Outcome::Allowed, 5, 5),
            verdict("max", Outcome::Allowed, u64::MAX, u64::MAX - 1),
            verdict(&long, Outcome::Allowed, 10, 3),
        ];
        for set in [
            HeaderSet::ALL,
            HeaderSet::IETF,
            HeaderSet::GITHUB,
            HeaderSet::NONE,
        ] {
            for v in &cases {
                let mut verdicts = Verdicts::default();
                verdicts.push(v.clone());
                let mut general = HeaderMap::new();
                set.render(&verdicts, &mut general);
                let cache = OnceLock::new();
                // Twice: the first call fills the cache, the second renders from it.
                for _ in 0..2 {
                    let mut cached = HeaderMap::new();
                    set.render_with(&verdicts, &mut cached, Some(&cache));
                    assert_eq!(sorted(&cached), sorted(&general), "{set:?} {v:?}");
                }
                assert_eq!(
                    cache.get().is_some_and(Option::is_some),
                    set != HeaderSet::NONE && v.limiter.len() < 100,
                    "the fast path is taken unless nothing is rendered or the name is too long"
                );
            }
        }
        let mut all = HeaderMap::new();
        let mut verdicts = Verdicts::default();
        verdicts.push(cases[0].clone());
        HeaderSet::ALL.render_with(&verdicts, &mut all, Some(&OnceLock::new()));
        assert_eq!(all["ratelimit"], r#""api";r=98;t=4"#);
        assert_eq!(all["x-ratelimit-reset"], "1700000004");
        assert_eq!(Constant::of(&cases[4]).map(|_| ()), None);
    }
}
