//! Redis key names: namespaced, hash-tagged for Cluster, bounded.

use tollgate_core::Algorithm;

/// Client keys longer than this are hashed.
pub(crate) const MAX_RAW_KEY: usize = 64;

/// Whether `b` may appear in a key stored as is: printable ASCII except the hash-tag braces (a client must not
/// pick the Cluster slot), `#` (which marks hashed keys) and the quote and escape characters.
const fn is_safe(b: u8) -> bool {
    matches!(b, 0x21..=0x7e) && !matches!(b, b'{' | b'}' | b'#' | b'"' | b'\\')
}

/// Whether `s` is a usable namespace: 1 to 64 safe characters.
pub(crate) fn valid_namespace(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_RAW_KEY && s.bytes().all(is_safe)
}

/// `<namespace>:{<client key>}:<tb|sw|fw>`. The braces are the hash tag: every key one script touches lands in one
/// Cluster slot. A long or unusual client key becomes `#` + its SHA-1 in hex, so its size and bytes are bounded
/// and it can never collide with a key stored as is (those never contain `#`).
pub(crate) fn redis_key(namespace: &str, key: &str, algorithm: Algorithm) -> String {
    let suffix = match algorithm {
        Algorithm::TokenBucket => "tb",
        Algorithm::SlidingWindowCounter => "sw",
        Algorithm::FixedWindow => "fw",
    };
    tagged(namespace, key, suffix)
}

/// `<namespace>:{<client key>}:inflight`: the sorted set of a key's concurrency slots.
pub(crate) fn slot_key(namespace: &str, key: &str) -> String {
    tagged(namespace, key, "inflight")
}

/// `<namespace>:{tollgate-startup-probe}:commands`: the start-up permission check's own key.
pub(crate) fn startup_probe_key(namespace: &str) -> String {
    tagged(namespace, "tollgate-startup-probe", "commands")
}

fn tagged(namespace: &str, key: &str, suffix: &str) -> String {
    let bytes = key.as_bytes();
    if !bytes.is_empty() && bytes.len() <= MAX_RAW_KEY && bytes.iter().all(|&b| is_safe(b)) {
        format!("{namespace}:{{{key}}}:{suffix}")
    } else {
        let digest = sha1_smol::Sha1::from(bytes).digest().to_string();
        format!("{namespace}:{{#{digest}}}:{suffix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_keys_are_kept_and_tagged() {
        assert_eq!(
            redis_key("tollgate", "user:42", Algorithm::TokenBucket),
            "tollgate:{user:42}:tb"
        );
        assert_eq!(
            redis_key("app", "10.0.0.1", Algorithm::SlidingWindowCounter),
            "app:{10.0.0.1}:sw"
        );
    }

    #[test]
    fn long_binary_or_tag_breaking_keys_are_hashed() {
        let long = "x".repeat(MAX_RAW_KEY + 1);
        for key in [
            long.as_str(),
            "a b",
            "caf\u{e9}",
            "{evil}",
            "a}b",
            "#abc",
            "",
            "line\nbreak",
        ] {
            let k = redis_key("tollgate", key, Algorithm::TokenBucket);
            assert!(k.starts_with("tollgate:{#"), "{key:?} -> {k}");
            assert_eq!(k.len(), "tollgate:{#}:tb".len() + 40, "{key:?} -> {k}");
            assert_eq!(k.matches('{').count(), 1);
        }
        let exact = "y".repeat(MAX_RAW_KEY);
        assert_eq!(
            redis_key("t", &exact, Algorithm::TokenBucket),
            format!("t:{{{exact}}}:tb")
        );
    }

    #[test]
    fn distinct_keys_stay_distinct() {
        let a = redis_key("t", "{a}", Algorithm::TokenBucket);
        let b = redis_key("t", "{b}", Algorithm::TokenBucket);
        assert_ne!(a, b);
        assert_ne!(
            redis_key("t", "a", Algorithm::TokenBucket),
            redis_key("t", "a", Algorithm::SlidingWindowCounter)
        );
    }

    #[test]
    fn namespaces_are_validated() {
        assert!(valid_namespace("tollgate"));
        assert!(valid_namespace("my-app:v2"));
        assert!(!valid_namespace(""));
        assert!(!valid_namespace("a{b"));
        assert!(!valid_namespace("with space"));
    }
}
