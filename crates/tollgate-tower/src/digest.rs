//! Stable digests for secret or unbounded key material (API keys, tokens).
//!
//! An API key must not be stored raw in a shared store (anyone who can read Redis could replay it), and a long or
//! binary header value must not become a long key. The digest is SHA-256 truncated to 128 bits, written as 32 hex
//! digits: preimage resistant (the key cannot be recovered), collision resistant far beyond any number of
//! clients (2^64 work for a collision), and — unlike `std`'s `DefaultHasher`, whose algorithm may change between
//! Rust releases — identical on every instance of a fleet, whatever it was built with. SHA-256 comes from the
//! RustCrypto `sha2` crate; the tests below pin it to the FIPS 180-4 vectors.
//!
//! ```
//! use tollgate_tower::digest::{hex_digest, sha256};
//!
//! assert_eq!(hex_digest(b"abc"), "ba7816bf8f01cfea414140de5dae2223");
//! assert_eq!(sha256(b"abc")[31], 0xad);
//! ```

use sha2::{Digest, Sha256};

/// The SHA-256 digest of `data`.
#[must_use]
pub fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// The first 128 bits of SHA-256 of `data` as 32 lowercase hex digits: the stored form of a secret key.
#[must_use]
pub fn hex_digest(data: &[u8]) -> String {
    let mut out = String::with_capacity(32);
    push_hex_digest(data, &mut out);
    out
}

/// Appends [`hex_digest`] of `data` to `out` without an intermediate allocation.
pub fn push_hex_digest(data: &[u8], out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for byte in &sha256(data)[..16] {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full_hex(data: &[u8]) -> String {
        sha256(data).iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn fips_180_4_vectors() {
        assert_eq!(
            full_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            full_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            full_hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        let million_a = vec![b'a'; 1_000_000];
        assert_eq!(
            full_hex(&million_a),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        );
    }

    #[test]
    fn padding_boundaries() {
        // 55, 56 and 64 bytes straddle the one-or-two final blocks decision.
        assert_eq!(
            full_hex(&[b'a'; 55]),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"
        );
        assert_eq!(
            full_hex(&[b'a'; 56]),
            "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"
        );
        assert_eq!(
            full_hex(&[b'a'; 64]),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"
        );
    }
}
