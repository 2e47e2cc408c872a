//! Structured-field strings (RFC 8941) for the rate-limit fields: limiter names in HTTP headers and gRPC metadata.

/// Appends `s` as a structured-field string (RFC 8941): quoted, `"` and `\` escaped, characters outside printable
/// ASCII replaced by `?`. Limiter names are rendered this way in the HTTP headers and the gRPC metadata alike.
pub(crate) fn push_sf_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars().map(visible_char) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// `c` if a header or metadata value may carry it as is (space and visible ASCII), `?` otherwise.
#[must_use]
pub(crate) const fn visible_char(c: char) -> char {
    if c == ' ' || c.is_ascii_graphic() {
        c
    } else {
        '?'
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sf_strings_are_quoted_escaped_and_visible() {
        let mut out = String::new();
        super::push_sf_string(&mut out, "per \"client\" é");
        assert_eq!(out, r#""per \"client\" ?""#);
    }
}
