//! The policy file as written: what serde reads, every table closed to unknown fields. Values that can be checked
//! on their own (a duration, a key, an algorithm) are checked while they are read, so that their errors carry the
//! value's place; checks across fields happen in [`resolve`](crate::resolve) with the places kept in [`Spanned`].

use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use toml::Spanned;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct FileSpec {
    /// Reverse-proxy networks whose `X-Forwarded-For` is trusted, for `client-ip` keys.
    #[serde(default)]
    pub(crate) trusted_proxies: Vec<Spanned<String>>,
    /// The header families responses carry: `ietf`, `github` (`X-RateLimit-*`), `all` or `none`.
    #[serde(default)]
    pub(crate) headers: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default, rename = "limiter")]
    pub(crate) limiters: Vec<LimiterSpec>,
}

/// One `[[limiter]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct LimiterSpec {
    pub(crate) name: Spanned<String>,
    pub(crate) key: Spanned<KeySpec>,
    #[serde(default)]
    pub(crate) algorithm: Option<Spanned<AlgorithmSpec>>,
    pub(crate) limit: Spanned<u64>,
    pub(crate) period: Spanned<Period>,
    #[serde(default)]
    pub(crate) burst: Option<Spanned<u64>>,
    /// After a denial, the key is refused for this long (brute-force lockout; `Policy::with_lockout`).
    #[serde(default)]
    pub(crate) lockout: Option<Spanned<Period>>,
    /// Tokens per request (default 1).
    #[serde(default)]
    pub(crate) cost: Option<Spanned<u64>>,
    /// Where the request's real cost is read once its response is ready (`header:<name>` or `extension`): the
    /// difference from `cost`, charged up front, is charged (or refunded) then.
    #[serde(default)]
    pub(crate) cost_after: Option<Spanned<CostAfterSpec>>,
    #[serde(default)]
    pub(crate) mode: Option<ModeSpec>,
    #[serde(default)]
    pub(crate) on_store_error: Option<FailureSpec>,
    /// HTTP paths (`/api/*` for a prefix); none: every route the layer covers.
    #[serde(default)]
    pub(crate) routes: Vec<Spanned<String>>,
    /// gRPC methods (`/package.Service/Method`, `/package.Service/*`); none: every method.
    #[serde(default)]
    pub(crate) methods: Vec<Spanned<String>>,
    /// Key values never limited (addresses or CIDRs for `client-ip` keys).
    #[serde(default)]
    pub(crate) exempt: Vec<Spanned<String>>,
    #[serde(default, rename = "override")]
    pub(crate) overrides: Vec<OverrideSpec>,
}

/// One `[[limiter.override]]`: a key value (or a CIDR for `client-ip` keys) with a policy of its own. Fields left
/// out are the limiter's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct OverrideSpec {
    pub(crate) key: Spanned<String>,
    #[serde(default)]
    pub(crate) algorithm: Option<Spanned<AlgorithmSpec>>,
    pub(crate) limit: Spanned<u64>,
    #[serde(default)]
    pub(crate) period: Option<Spanned<Period>>,
    #[serde(default)]
    pub(crate) burst: Option<Spanned<u64>>,
    #[serde(default)]
    pub(crate) lockout: Option<Spanned<Period>>,
}

/// One part of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyPart {
    /// The client address, through the trusted proxies (gRPC: the peer address).
    ClientIp,
    /// A header (gRPC: a metadata entry), lower-cased.
    Header(String),
    /// The route (HTTP: method and matched template; gRPC: the method).
    Route,
    /// One bucket for every request.
    Global,
}

/// `key`: one part, or an array of parts (a tuple: one bucket per combination).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeySpec(pub(crate) Vec<KeyPart>);

const KEY_EXPECTED: &str = "client-ip, header:<name>, route or global";

fn key_part(text: &str) -> Result<KeyPart, String> {
    match text {
        "client-ip" => Ok(KeyPart::ClientIp),
        "route" => Ok(KeyPart::Route),
        "global" => Ok(KeyPart::Global),
        other => match other.strip_prefix("header:") {
            Some(name) if http::HeaderName::try_from(name).is_ok() => {
                Ok(KeyPart::Header(name.to_ascii_lowercase()))
            }
            Some(name) => Err(format!(
                "{name:?} is not a header name (letters, digits and -, e.g. header:x-api-key)"
            )),
            None => Err(format!("unknown key {other:?}: expected {KEY_EXPECTED}")),
        },
    }
}

impl<'de> Deserialize<'de> for KeySpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;

        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = KeySpec;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a key ({KEY_EXPECTED}) or an array of them")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeySpec, E> {
                key_part(v)
                    .map(|part| KeySpec(vec![part]))
                    .map_err(E::custom)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<KeySpec, A::Error> {
                let mut parts = Vec::new();
                while let Some(text) = seq.next_element::<String>()? {
                    parts.push(key_part(&text).map_err(de::Error::custom)?);
                }
                match parts.len() {
                    0 => Err(de::Error::custom("an empty key: name one part at least")),
                    // Tuples of up to four parts, as in code.
                    5.. => Err(de::Error::custom("a key of more than 4 parts")),
                    _ => Ok(KeySpec(parts)),
                }
            }
        }

        deserializer.deserialize_any(KeyVisitor)
    }
}

/// `cost-after`: `header:<name>` (a response header, gRPC: response metadata, holding a whole number),
/// `extension` (the `FinalCost` the handler puts in the response's extensions), or `stream:<count>[:cut|:finish]`
/// (counted as the body streams, by a `StreamCostLayer` around the limiters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CostAfterSpec(pub(crate) tollgate_tower::CostAfter);

const COST_AFTER_EXPECTED: &str =
    "header:<name>, extension, or stream:<input|output|total>[:cut|:finish]";

fn cost_after(text: &str) -> Result<tollgate_tower::CostAfter, String> {
    use tollgate_tower::CostAfter;
    use tollgate_tower::stream_cost::{Exhausted, Streamed, Tokens};
    if text == "extension" {
        return Ok(CostAfter::Extension);
    }
    if let Some(rest) = text.strip_prefix("stream:") {
        let (tokens, exhausted) = rest.split_once(':').unwrap_or((rest, "finish"));
        let tokens = match tokens {
            "input" => Tokens::Input,
            "output" => Tokens::Output,
            "total" => Tokens::Total,
            _ => {
                return Err(format!(
                    "unknown streamed count {tokens:?} in {text:?}: expected input, output or total"
                ));
            }
        };
        let exhausted = match exhausted {
            "cut" => Exhausted::Cut,
            "finish" => Exhausted::Finish,
            _ => {
                return Err(format!(
                    "unknown {exhausted:?} in {text:?}: expected cut or finish at the budget"
                ));
            }
        };
        return Ok(CostAfter::Streamed(
            Streamed::new(tokens).on_exhausted(exhausted),
        ));
    }
    match text.strip_prefix("header:") {
        Some(name) if http::HeaderName::try_from(name).is_ok() => {
            Ok(CostAfter::Header(name.to_ascii_lowercase().into()))
        }
        Some(name) => Err(format!(
            "{name:?} is not a header name (letters, digits and -, e.g. header:x-cost)"
        )),
        None => Err(format!(
            "unknown cost-after {text:?}: expected {COST_AFTER_EXPECTED}"
        )),
    }
}

impl<'de> Deserialize<'de> for CostAfterSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        cost_after(&text).map(Self).map_err(de::Error::custom)
    }
}

/// `algorithm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AlgorithmSpec(pub(crate) tollgate_core::Algorithm);

impl<'de> Deserialize<'de> for AlgorithmSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        match text.as_str() {
            "token-bucket" => Ok(Self(tollgate_core::Algorithm::TokenBucket)),
            "sliding-window" => Ok(Self(tollgate_core::Algorithm::SlidingWindowCounter)),
            other => Err(de::Error::custom(format!(
                "unknown algorithm {other:?}: expected token-bucket or sliding-window"
            ))),
        }
    }
}

/// `mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ModeSpec(pub(crate) tollgate_tower::Mode);

impl<'de> Deserialize<'de> for ModeSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use tollgate_tower::Mode;
        let text = String::deserialize(deserializer)?;
        match text.as_str() {
            "enforce" => Ok(Self(Mode::Enforce)),
            "shadow" => Ok(Self(Mode::Shadow)),
            "off" => Ok(Self(Mode::Off)),
            other => Err(de::Error::custom(format!(
                "unknown mode {other:?}: expected enforce, shadow or off"
            ))),
        }
    }
}

/// `on-store-error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FailureSpec(pub(crate) tollgate_core::FailurePolicy);

impl<'de> Deserialize<'de> for FailureSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map(Self).map_err(de::Error::custom)
    }
}

/// A duration: a whole number and a unit, `500ms`, `10s`, `15m`, `1h`, `1d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Period(pub(crate) Duration);

pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    let expected = || format!("{text:?}: expected a duration such as 500ms, 10s, 15m, 1h or 1d");
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(expected)?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| expected())?;
    let unit = match unit {
        "ms" => Duration::from_millis(1),
        "s" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        "d" => Duration::from_secs(86_400),
        _ => return Err(expected()),
    };
    let total = u32::try_from(number)
        .ok()
        .and_then(|n| unit.checked_mul(n))
        .ok_or_else(|| format!("{text:?}: too long"))?;
    if total.is_zero() {
        return Err(format!("{text:?}: must be longer than zero"));
    }
    Ok(total)
}

impl<'de> Deserialize<'de> for Period {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        duration(&text).map(Self).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_a_whole_number_and_a_unit() {
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(duration("2d"), Ok(Duration::from_secs(172_800)));
        for bad in ["10", "s", "10x", "1.5s", "-1s", "", " 1s"] {
            assert!(
                duration(bad).unwrap_err().contains("expected a duration"),
                "{bad}"
            );
        }
        assert!(duration("0s").unwrap_err().contains("longer than zero"));
        assert!(duration("99999999999d").unwrap_err().contains("too long"));
    }

    #[test]
    fn cost_after_is_a_header_or_the_extension() {
        use tollgate_tower::CostAfter;
        assert_eq!(cost_after("extension"), Ok(CostAfter::Extension));
        use tollgate_tower::stream_cost::{Exhausted, Streamed, Tokens};
        assert_eq!(
            cost_after("stream:total:cut"),
            Ok(CostAfter::Streamed(
                Streamed::new(Tokens::Total).on_exhausted(Exhausted::Cut)
            ))
        );
        assert_eq!(
            cost_after("stream:output"),
            Ok(CostAfter::Streamed(Streamed::new(Tokens::Output)))
        );
        assert!(
            cost_after("stream:words")
                .unwrap_err()
                .contains("input, output or total")
        );
        assert!(
            cost_after("stream:output:stop")
                .unwrap_err()
                .contains("cut or finish")
        );
        assert_eq!(
            cost_after("header:X-Cost"),
            Ok(CostAfter::Header("x-cost".into()))
        );
        assert!(
            cost_after("header:a b")
                .unwrap_err()
                .contains("not a header name")
        );
        assert!(
            cost_after("header:")
                .unwrap_err()
                .contains("not a header name")
        );
        assert!(
            cost_after("body")
                .unwrap_err()
                .contains("expected header:<name>, extension, or stream:")
        );
    }

    #[test]
    fn key_parts() {
        assert_eq!(key_part("client-ip"), Ok(KeyPart::ClientIp));
        assert_eq!(
            key_part("header:X-Api-Key"),
            Ok(KeyPart::Header("x-api-key".into()))
        );
        assert!(
            key_part("header:")
                .unwrap_err()
                .contains("not a header name")
        );
        assert!(
            key_part("header:a b")
                .unwrap_err()
                .contains("not a header name")
        );
        assert!(
            key_part("ip")
                .unwrap_err()
                .contains("expected client-ip, header:<name>, route or global")
        );
    }
}
