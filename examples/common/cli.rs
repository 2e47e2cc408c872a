//! What every example's command line shares (clap): the exit on a bad flag, and the value parsers (durations as
//! `500ms`, `1s`, `0.5s`, `5m`, `1h`; whole numbers above 0; percentages; absolute URLs).
//!
//! Included with `#[path = "common/cli.rs"] mod cli;`; an example uses the parts it needs.
#![allow(dead_code)]

use std::fmt::Display;
use std::time::Duration;

use clap::error::ErrorKind;

/// Parses the process's arguments into `T`. `--help` prints the generated help on stdout and exits 0; a bad flag
/// prints clap's error on stderr after the program's name (`axum_server: error: …`) and exits 2.
pub(crate) fn parse<T: clap::Parser>() -> T {
    T::try_parse().unwrap_or_else(|e| exit(&e))
}

/// Exits with `e` as [`parse`] does.
pub(crate) fn exit(e: &clap::Error) -> ! {
    if !e.use_stderr() {
        // Help and version: stdout, status 0 (a closed pipe, `--help | head`, is no error).
        let _ = e.print();
        std::process::exit(0);
    }
    eprint!("{}: {}", program(), e.render());
    std::process::exit(e.exit_code());
}

/// A flag combination the parser cannot see (e.g. `--fleet-capacity` without Redis): clap's error form, one
/// line, status 2.
pub(crate) fn fail(message: impl Display) -> ! {
    exit(&clap::Error::raw(
        ErrorKind::ArgumentConflict,
        format!("{message}\n"),
    ))
}

/// The program's name, as errors start with it.
fn program() -> String {
    std::env::args()
        .next()
        .as_deref()
        .map(std::path::Path::new)
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "example".to_owned())
}

/// An absolute `http://` or `https://` URL with a host.
pub(crate) fn absolute_url(value: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = value.parse().map_err(|e| format!("not a URL: {e}"))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http" | "https"), Some(_)) => Ok(uri),
        _ => Err(
            "expected an absolute http:// or https:// URL with a host, e.g. http://127.0.0.1:3000/"
                .into(),
        ),
    }
}

/// A whole number above 0.
pub(crate) fn positive(v: &str) -> Result<u64, String> {
    match v.replace('_', "").parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a whole number above 0".to_owned()),
    }
}

/// A whole number above 0 that fits this machine's `usize`.
pub(crate) fn positive_usize(v: &str) -> Result<usize, String> {
    usize::try_from(positive(v)?).map_err(|_| "too large for this machine".to_owned())
}

/// A percentage from 1 to 100 (`20` or `20%`).
pub(crate) fn percent(v: &str) -> Result<u32, String> {
    match v.trim_end_matches('%').parse::<u32>() {
        Ok(p) if (1..=100).contains(&p) => Ok(p),
        _ => Err("expected a percentage from 1 to 100".to_owned()),
    }
}

/// `500ms`, `1s`, `0.5s`, `10s`, `5m`, `1h` (also `us`; a number needs its unit; zero is refused).
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    let d = duration_or_zero(s)?;
    if d.is_zero() {
        return Err("must be longer than zero".to_owned());
    }
    Ok(d)
}

/// Like [`duration`], but `0s` (or `0`) is allowed: e.g. "no pause".
pub(crate) fn duration_or_zero(s: &str) -> Result<Duration, String> {
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let expected = || "expected a number and a unit, e.g. 500ms, 1s, 0.5s, 1h".to_owned();
    // A decimal fraction is kept exact in nanoseconds (digits past a nanosecond are dropped).
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || fraction.contains('.') || (number.contains('.') && fraction.is_empty()) {
        return Err(expected());
    }
    let whole: u128 = whole.parse().map_err(|_| expected())?;
    let scale: u128 = match unit {
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "" if whole == 0 && fraction.bytes().all(|b| b == b'0') => return Ok(Duration::ZERO),
        "" => return Err("add a unit (us, ms, s, m or h)".to_owned()),
        other => return Err(format!("unknown unit {other:?} (use us, ms, s, m or h)")),
    };
    let mut nanos = whole.saturating_mul(scale);
    let mut place = scale;
    for digit in fraction.bytes().take(13) {
        place /= 10;
        nanos = nanos.saturating_add(u128::from(digit - b'0') * place);
    }
    let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

#[cfg(test)]
mod tests {
    // Imported in each test: a bench that includes this file compiles the module without its tests.
    #[test]
    fn durations_take_a_unit_and_keep_fractions_exact() {
        use super::*;
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("0.5h"), Ok(Duration::from_secs(1800)));
        assert_eq!(duration("1.25s"), Ok(Duration::from_millis(1250)));
        assert_eq!(duration_or_zero("0"), Ok(Duration::ZERO));
        for bad in ["5x", "1.s", ".5s", "1.2.3s", "10", "0s", ""] {
            assert!(duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn numbers_and_percentages_have_their_bounds() {
        use super::*;
        assert_eq!(positive("1_000"), Ok(1000));
        assert!(positive("0").is_err());
        assert!(positive("-1").is_err());
        assert_eq!(percent("20%"), Ok(20));
        assert!(percent("0").is_err());
        assert!(percent("101").is_err());
    }
}
