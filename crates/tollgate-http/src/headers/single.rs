//! The common case — one enforced limiter — rendered with a single allocation per response.
//!
//! Per response only three numbers change (remaining, reset, used): they are formatted side by side into one
//! inline buffer that becomes one shared [`Bytes`], which every per-response field slices. The fields that never
//! change are built once per distinct limiter (name, limit, window) and kept for the life of the process as
//! `'static` values, so a response carries them without a reference count, and no layer needs a shared cache
//! (which every request on every thread would otherwise count references on). Limiters come from the
//! configuration, so the kept set is as small as the configuration.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::sf::{push_sf_string, visible_char};
use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue};
use tollgate_tower::Verdict;

use super::draft::{self, effective_window_secs};
use super::{
    HeaderSet, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
    X_RATELIMIT_RESET, X_RATELIMIT_RESOURCE, X_RATELIMIT_USED, push_u64,
};

/// Room for `"<name>";r=<u64>;t=<u64>` and three more `u64`s; a longer name takes the general path.
const INLINE: usize = 192;
const MAX_DIGITS: usize = 20;

/// The fields of one limiter that never change.
#[derive(Debug)]
pub(super) struct Constant {
    name: Box<str>,
    limit: u64,
    window: Duration,
    /// `None` when the name is too long for the inline buffer: that limiter takes the general path.
    fields: Option<Fields>,
}

#[derive(Debug)]
struct Fields {
    policy: HeaderValue,
    limit: HeaderValue,
    resource: HeaderValue,
    /// `"<name>";r=`: the start of the `RateLimit` value.
    state_prefix: Box<[u8]>,
}

thread_local! {
    /// The constants this thread used last: most responses find theirs here, without the process-wide lock.
    static RECENT: Cell<[Option<&'static Constant>; 4]> = const { Cell::new([None; 4]) };
}

/// At most this many limiters' constants are kept. Limits come from the configuration, but a custom store may
/// compute them per key (tiers per customer); past the bound, other limiters' fields are formatted per response
/// instead, so memory stays bounded whatever the store returns.
const MAX_KEPT: usize = 1024;

/// Set once [`MAX_KEPT`] is reached: from then on only this thread's recent constants are used, and the
/// process-wide set is not locked again.
static FULL: AtomicBool = AtomicBool::new(false);

/// The process-wide constants, by limiter name.
struct Kept {
    by_name: BTreeMap<Box<str>, Vec<&'static Constant>>,
    count: usize,
}

impl Kept {
    const fn new() -> Self {
        Self {
            by_name: BTreeMap::new(),
            count: 0,
        }
    }
}

impl Constant {
    /// The constants of `v`'s limiter, built on first use; `None` once [`MAX_KEPT`] other limiters are kept.
    pub(super) fn of(v: &Verdict) -> Option<&'static Self> {
        let recent = RECENT.try_with(Cell::get).unwrap_or_default();
        if let Some(constant) = recent.into_iter().flatten().find(|c| c.describes(v)) {
            return Some(constant);
        }
        if FULL.load(Ordering::Relaxed) {
            return None;
        }
        let constant = Self::kept(v)?;
        let _ = RECENT.try_with(|cell| {
            let mut recent = cell.get();
            recent.rotate_right(1);
            recent[0] = Some(constant);
            cell.set(recent);
        });
        Some(constant)
    }

    /// The process-wide constants of `v`'s limiter.
    fn kept(v: &Verdict) -> Option<&'static Self> {
        static KEPT: Mutex<Kept> = Mutex::new(Kept::new());
        let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(constant) = kept
            .by_name
            .get(&*v.limiter)
            .and_then(|same_name| same_name.iter().find(|c| c.describes(v)))
        {
            return Some(constant);
        }
        if kept.count >= MAX_KEPT {
            FULL.store(true, Ordering::Relaxed);
            return None;
        }
        let constant: &'static Self = Box::leak(Box::new(Self::build(v)));
        kept.by_name
            .entry(v.limiter.as_ref().into())
            .or_default()
            .push(constant);
        kept.count += 1;
        Some(constant)
    }

    fn build(v: &Verdict) -> Self {
        Self {
            name: v.limiter.as_ref().into(),
            limit: v.decision.limit,
            window: v.window,
            fields: Fields::build(v),
        }
    }

    /// Whether these constants describe `v`'s limiter.
    fn describes(&self, v: &Verdict) -> bool {
        self.limit == v.decision.limit && self.window == v.window && *self.name == *v.limiter
    }
}

impl Fields {
    fn build(v: &Verdict) -> Option<Self> {
        let mut policy = String::with_capacity(64);
        push_sf_string(&mut policy, &v.limiter);
        let mut state_prefix = policy.clone().into_bytes();
        state_prefix.extend_from_slice(draft::AVAILABLE.as_bytes());
        if state_prefix.len() + 3 + 4 * MAX_DIGITS > INLINE {
            return None;
        }
        policy.push_str(draft::QUOTA);
        push_u64(&mut policy, v.window_limit());
        policy.push_str(draft::WINDOW);
        push_u64(&mut policy, v.window_secs());
        let mut limit = String::new();
        push_u64(&mut limit, v.decision.limit);
        Some(Self {
            policy: kept_value(policy)?,
            limit: kept_value(limit)?,
            resource: kept_value(v.limiter.chars().map(visible_char).collect())?,
            state_prefix: state_prefix.into_boxed_slice(),
        })
    }
}

/// `value` as a header value that lives as long as the process (it belongs to a kept [`Constant`]).
fn kept_value(value: String) -> Option<HeaderValue> {
    // Checked first: `from_static` would panic on a byte a header cannot carry.
    HeaderValue::from_str(&value).ok()?;
    Some(HeaderValue::from_static(Box::leak(value.into_boxed_str())))
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
        self.push(itoa::Buffer::new().format(n).as_bytes())
    }
}

impl HeaderSet {
    /// Renders `v` from its limiter's kept constants; `None` (nothing written) when they cannot be kept or the values
    /// do not fit the inline buffer.
    pub(super) fn render_single(self, v: &Verdict, headers: &mut HeaderMap) -> Option<()> {
        // The kept constants are a quota per window's (`w`, `t` and the GitHub fields); a concurrency limiter's
        // fields take the general path.
        if !draft::windowed(v) {
            return None;
        }
        let constant = Constant::of(v)?.fields.as_ref()?;
        let mut s = Scratch {
            len: 0,
            bytes: [0; INLINE],
        };
        // `RateLimit: "<name>";r=<available>;t=<effective window>`; X-RateLimit-Remaining slices its `r` when both
        // are on.
        let (state, mut remaining) = if self.state {
            let start = s.push(&constant.state_prefix)?.start;
            let remaining = s.push_u64(v.decision.remaining)?;
            s.push(draft::EFFECTIVE_WINDOW.as_bytes())?;
            let end = s.push_u64(effective_window_secs(v))?.end;
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
        if self.policy {
            headers.insert(RATELIMIT_POLICY, constant.policy.clone());
        }
        if let Some(state) = state.and_then(value) {
            headers.insert(RATELIMIT, state);
        }
        if let Some([remaining, reset, used]) = numbers {
            headers.insert(X_RATELIMIT_LIMIT, constant.limit.clone());
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
    use std::time::Duration;

    use http::HeaderMap;
    use tollgate_core::{Decision, Outcome, Timestamp};
    use tollgate_tower::{Verdict, Verdicts};

    use super::Constant;
    use crate::headers::HeaderSet;

    fn verdict(name: &str, outcome: Outcome, limit: u64, remaining: u64) -> Verdict {
        Verdict::new(
            name.to_owned(),
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

    /// The single-limiter path writes exactly what the general path writes, for every header set, allowed or
    /// denied, with names that need escaping, extreme numbers, and a name too long for the inline buffer.
    #[test]
    fn single_limiter_path_matches_the_general_path() {
        let long = "n".repeat(300);
        let cases = [
            verdict("api", Outcome::Allowed, 100, 98),
            verdict("api", Outcome::Limited, 100, 0),
            verdict("say \"hi\" \\ é", Outcome::Allowed, 5, 5),
            verdict("max", Outcome::Allowed, u64::MAX, u64::MAX - 1),
            verdict(&long, Outcome::Allowed, 10, 3),
            // A concurrency limiter's: no window, and the general path.
            Verdict::in_flight("slots", 5, 4, None, Timestamp::from_micros(1)),
            Verdict::in_flight(
                "slots",
                5,
                0,
                Some(Duration::from_secs(1)),
                Timestamp::from_micros(1),
            ),
        ];
        for set in [
            HeaderSet::ALL,
            HeaderSet::IETF,
            HeaderSet::RATELIMIT_ONLY,
            HeaderSet::GITHUB,
            HeaderSet::NONE,
            HeaderSet::RATELIMIT_ONLY.union(HeaderSet::GITHUB),
        ] {
            for v in &cases {
                let verdicts = Verdicts::from(v.clone());
                let mut general = HeaderMap::new();
                if set != HeaderSet::NONE {
                    set.render_general(&verdicts, &mut general);
                }
                // Twice: the first call builds the constants, the second finds them.
                for _ in 0..2 {
                    let mut single = HeaderMap::new();
                    set.render(&verdicts, &mut single);
                    assert_eq!(sorted(&single), sorted(&general), "{set:?} {v:?}");
                    let mut one = HeaderMap::new();
                    set.render_one(v, &mut one);
                    assert_eq!(sorted(&one), sorted(&general), "{set:?} {v:?}");
                }
            }
        }
        for v in &cases {
            assert_eq!(
                Constant::of(v).is_some_and(|c| c.fields.is_some()),
                v.limiter.len() < 100,
                "the single path is taken unless the name is too long: {v:?}"
            );
            assert!(
                std::ptr::eq(Constant::of(v).unwrap(), Constant::of(v).unwrap()),
                "kept once"
            );
        }
        // Same name, another limit: other constants.
        assert!(!std::ptr::eq(
            Constant::of(&cases[0]).unwrap(),
            Constant::of(&cases[3]).unwrap()
        ));
        // 7 per 1.5 s, announced over 2 s: 9.
        let other_limit = verdict("api", Outcome::Allowed, 7, 6);
        assert_eq!(
            Constant::of(&other_limit)
                .and_then(|c| c.fields.as_ref())
                .unwrap()
                .policy,
            r#""api";q=9;w=2"#
        );
        let mut all = HeaderMap::new();
        HeaderSet::ALL.render(&Verdicts::from(cases[0].clone()), &mut all);
        // Draft -11: 98 of 100 per 1.5 s accrue in 1.47 s.
        assert_eq!(all["ratelimit"], r#""api";r=98;t=2"#);
        assert_eq!(all["x-ratelimit-reset"], "1700000004");
    }
}
