//! Reading policy files: the documented example as written, every field, and every error at its place.

use tollgate_config::{PolicyFile, PolicyFileError};

/// The policy file a user first wrote for the axum and tonic layers, byte for byte.
const FIRST_EXAMPLE: &str = r#"[[limiter]]
name = "per-key"
key = "header:x-api-key"      # client-ip | header:<name> | route | global
algorithm = "token-bucket"    # token-bucket | sliding-window
limit = 3
period = "10s"
burst = 3
exempt = ["internal"]         # keys never limited (CIDRs for client-ip keys)

[[limiter.override]]
key = "gold"                  # a key value (or a CIDR for client-ip keys)
limit = 6
period = "10s"
burst = 6
"#;

fn error(text: &str) -> PolicyFileError {
    PolicyFile::parse(text, "limits.toml").expect_err("an invalid file")
}

/// `text`'s error as `line:column: message`.
fn at(text: &str) -> String {
    let err = error(text);
    assert_eq!(err.origin(), "limits.toml");
    format!(
        "{}:{}: {}",
        err.line().expect("a line"),
        err.column().expect("a column"),
        err.message()
    )
}

#[test]
fn the_issue_example_parses_as_written() {
    let file = PolicyFile::parse(FIRST_EXAMPLE, "limits.toml").unwrap();
    assert_eq!(file.limiters().collect::<Vec<_>>(), ["per-key"]);
    assert_eq!(file.origin(), "limits.toml");
    // The same file as shipped with the examples.
    let shipped = PolicyFile::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/policy.toml"
    ))
    .unwrap();
    assert_eq!(shipped.limiters().collect::<Vec<_>>(), ["per-key"]);
}

#[test]
fn every_field() {
    let text = r#"
trusted-proxies = ["10.0.0.0/8", "fd00::/8"]
headers = ["ietf", "github"]

[[limiter]]
name = "per-key"
key = "header:X-Api-Key"
algorithm = "token-bucket"
limit = 3
period = "10s"
burst = 5
lockout = "15m"
cost = 2
cost-after = "header:X-Cost"
mode = "shadow"
on-store-error = "local"
routes = ["/", "/api/*"]
methods = ["/helloworld.Greeter/*"]
exempt = ["internal", "ops"]

[[limiter.override]]
key = "gold"
limit = 6
period = "1m"
burst = 6

[[limiter.override]]
key = "silver"
algorithm = "sliding-window"
limit = 4

[[limiter]]
name = "per-client"
key = "client-ip"
algorithm = "sliding-window"
limit = 100
period = "1h"
mode = "off"
on-store-error = "open"
exempt = ["10.1.0.0/16", "192.0.2.7", "2001:db8::/32"]

[[limiter.override]]
key = "203.0.113.0/24"
limit = 1000

[[limiter]]
name = "per-route"
key = ["client-ip", "route"]
limit = 1
period = "500ms"
mode = "enforce"
on-store-error = "closed"

[[limiter]]
name = "everyone"
key = "global"
limit = 10000
period = "1d"
cost-after = "extension"
"#;
    let file = PolicyFile::parse(text, "limits.toml").unwrap();
    assert_eq!(
        file.limiters().collect::<Vec<_>>(),
        ["per-key", "per-client", "per-route", "everyone"]
    );
    // Parsing is deterministic, and a different value is a different policy.
    assert_eq!(file, PolicyFile::parse(text, "limits.toml").unwrap());
    assert_ne!(
        file,
        PolicyFile::parse(&text.replace("limit = 1000", "limit = 999"), "limits.toml").unwrap()
    );
    assert_ne!(
        file,
        PolicyFile::parse(&text.replace("X-Cost", "x-tokens"), "limits.toml").unwrap(),
        "where the cost is read is part of a limiter"
    );
    // No limiter at all is a valid (empty) policy.
    assert_eq!(PolicyFile::parse("", "x").unwrap().limiters().count(), 0);
}

#[test]
fn unknown_fields_are_errors_at_their_place() {
    assert_eq!(
        at("limiters = []\n"),
        "1:1: unknown field `limiters`, expected one of `trusted-proxies`, `headers`, `limiter`"
    );
    let limiter = at("[[limiter]]\nname = \"a\"\nkey = \"global\"\nlimt = 3\n");
    assert!(
        limiter.starts_with("4:1: unknown field `limt`, expected one of `name`, `key`,"),
        "{limiter}"
    );
    let o = at(
        "[[limiter]]\nname = \"a\"\nkey = \"global\"\nlimit = 3\nperiod = \"1s\"\n[[limiter.override]]\nkey = \"x\"\nlimit = 1\nexempt = true\n",
    );
    assert!(
        o.starts_with("9:1: unknown field `exempt`, expected one of `key`, `algorithm`, `limit`"),
        "{o}"
    );
}

#[test]
fn missing_and_mistyped_fields() {
    let missing = at("[[limiter]]\nname = \"a\"\nkey = \"global\"\nperiod = \"1s\"\n");
    assert_eq!(missing, "1:1: missing field `limit`");
    assert_eq!(
        at("[[limiter]]\nname = 1\n"),
        "2:8: invalid type: integer `1`, expected a string"
    );
    assert_eq!(
        at("[[limiter]]\nname = \"a\"\nkey = \"global\"\nlimit = \"3\"\nperiod = \"1s\"\n"),
        "4:9: invalid type: string \"3\", expected u64"
    );
    assert_eq!(
        at("[[limiter]]\nname = \"a\"\nkey = \"global\"\nlimit = -3\nperiod = \"1s\"\n"),
        "4:9: invalid value: integer `-3`, expected u64"
    );
    assert_eq!(
        at("[[limiter]]\nname = \"a\"\nkey = 3\n"),
        "3:7: invalid type: integer `3`, expected a key (client-ip, header:<name>, route or global) or an array of them"
    );
    // Not TOML at all.
    assert!(
        at("[[limiter]\n").starts_with("1:"),
        "{}",
        at("[[limiter]\n")
    );
}

/// A limiter with `line` added (at line 6) to a valid one.
fn limiter_with(line: &str) -> String {
    format!(
        "[[limiter]]\nname = \"a\"\nkey = \"header:x-api-key\"\nlimit = 3\nperiod = \"10s\"\n{line}\n"
    )
}

#[test]
fn bad_values_name_what_was_expected() {
    let cases = [
        (
            "algorithm = \"gcra\"",
            "6:13: unknown algorithm \"gcra\": expected token-bucket or sliding-window",
        ),
        (
            "mode = \"dark\"",
            "6:8: unknown mode \"dark\": expected enforce, shadow or off",
        ),
        (
            "on-store-error = \"retry\"",
            "6:18: unknown failure policy \"retry\": expected open, closed or local",
        ),
        (
            "burst = 0",
            "6:9: a token bucket's burst must be at least 1",
        ),
        (
            "cost = 4",
            "6:8: a cost of 4 is more than the policy ever allows at once (3)",
        ),
        (
            "routes = [\"api\"]",
            "6:11: \"api\": a route is a path from /, with at most one * at its end (a prefix)",
        ),
        (
            "methods = [\"/a*/b\"]",
            "6:12: \"/a*/b\": a gRPC method is a path from /, with at most one * at its end (a prefix)",
        ),
        ("exempt = [\"\"]", "6:11: an empty key value"),
        (
            "cost-after = \"body\"",
            "6:14: unknown cost-after \"body\": expected header:<name>, extension, or stream:<input|output|total>[:cut|:finish]",
        ),
        (
            "cost-after = \"header:x cost\"",
            "6:14: \"x cost\" is not a header name (letters, digits and -, e.g. header:x-cost)",
        ),
        (
            "cost-after = 3",
            "6:14: invalid type: integer `3`, expected a string",
        ),
    ];
    for (line, expected) in cases {
        let text = limiter_with(line);
        assert_eq!(at(&text), expected, "{line}");
    }
    assert_eq!(
        at("[[limiter]]\nname = \"a\"\nkey = \"global\"\nlimit = 0\nperiod = \"1s\"\n"),
        "4:9: a quota's limit must be at least 1"
    );
    assert_eq!(
        at("[[limiter]]\nname = \"a\"\nkey = \"global\"\nlimit = 3\nperiod = \"0s\"\n"),
        "5:10: \"0s\": must be longer than zero"
    );
    assert_eq!(
        at("[[limiter]]\nname = \"a\"\nkey = \"global\"\nlimit = 3\nperiod = \"10\"\n"),
        "5:10: \"10\": expected a duration such as 500ms, 10s, 15m, 1h or 1d"
    );
    assert_eq!(
        at(
            "[[limiter]]\nname = \"a\"\nkey = \"global\"\nalgorithm = \"sliding-window\"\nlimit = 3\nperiod = \"1s\"\nburst = 5\n"
        ),
        "7:9: burst applies to the token-bucket algorithm only"
    );
    assert_eq!(
        at("[[limiter]]\nname = \"a\"\nkey = [\"client-ip\", \"header:\"]\n"),
        "3:7: \"\" is not a header name (letters, digits and -, e.g. header:x-api-key)"
    );
    assert_eq!(
        at("[[limiter]]\nname = \"a\"\nkey = []\n"),
        "3:7: an empty key: name one part at least"
    );
    assert_eq!(
        at("[[limiter]]\nname = \"a\"\nkey = \"ip\"\n"),
        "3:7: unknown key \"ip\": expected client-ip, header:<name>, route or global"
    );
}

#[test]
fn client_ip_values_are_addresses_or_networks() {
    let text = |value: &str| {
        format!(
            "[[limiter]]\nname = \"a\"\nkey = \"client-ip\"\nlimit = 3\nperiod = \"1s\"\nexempt = [\"{value}\"]\n"
        )
    };
    for ok in [
        "10.0.0.0/8",
        "192.0.2.1",
        "::1",
        "2001:db8::/32",
        "0.0.0.0/0",
    ] {
        PolicyFile::parse(&text(ok), "limits.toml").unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    assert_eq!(
        at(&text("internal")),
        "6:11: \"internal\": expected an address or a CIDR such as 10.0.0.0/8 (the key is client-ip)"
    );
    assert_eq!(
        at(&text("10.0.0.0/33")),
        "6:11: 10.0.0.0/33: the prefix is longer than the address (32 bits at most)"
    );
    // An override's key too, and a non-address key takes any text.
    let o = "[[limiter]]\nname = \"a\"\nkey = \"client-ip\"\nlimit = 3\nperiod = \"1s\"\n[[limiter.override]]\nkey = \"gold\"\nlimit = 6\n";
    assert_eq!(
        at(o),
        "7:7: \"gold\": expected an address or a CIDR such as 10.0.0.0/8 (the key is client-ip)"
    );
    PolicyFile::parse(&o.replace("client-ip", "header:x-api-key"), "x").unwrap();
}

#[test]
fn names_are_unique_and_plain() {
    let two = "[[limiter]]\nname = \"a\"\nkey = \"global\"\nlimit = 3\nperiod = \"1s\"\n\n[[limiter]]\nname = \"a\"\nkey = \"global\"\nlimit = 3\nperiod = \"1s\"\n";
    assert_eq!(
        at(two),
        "8:8: a second limiter named \"a\": names are unique"
    );
    assert_eq!(
        at("[[limiter]]\nname = \"a#b\"\nkey = \"global\"\nlimit = 3\nperiod = \"1s\"\n"),
        "2:8: \"a#b\": a limiter name is not empty and has no #, :, braces or control characters"
    );
}

#[test]
fn top_level_settings() {
    assert_eq!(
        at("trusted-proxies = [\"10.0.0.0/40\"]\n"),
        "1:20: invalid CIDR \"10.0.0.0/40\": prefix length 40 exceeds 32"
    );
    assert_eq!(
        at("headers = [\"ietf\", \"x\"]\n"),
        "1:20: unknown header family \"x\": expected ietf, ratelimit, github, all or none"
    );
}

#[test]
fn a_file_that_cannot_be_read_says_so() {
    let err = PolicyFile::load("/nonexistent/limits.toml").unwrap_err();
    assert_eq!(err.line(), None);
    assert!(
        err.to_string()
            .starts_with("/nonexistent/limits.toml: cannot read the policy file:"),
        "{err}"
    );
}

#[test]
fn lockouts_are_durations_and_part_of_the_policy() {
    let base =
        "[[limiter]]\nname = \"login\"\nkey = \"header:x-user\"\nlimit = 5\nperiod = \"1m\"\n";
    let locked = PolicyFile::parse(&format!("{base}lockout = \"15m\"\n"), "x").unwrap();
    assert_ne!(
        locked,
        PolicyFile::parse(base, "x").unwrap(),
        "a lockout is part of the policy"
    );
    assert_eq!(
        at(&format!("{base}lockout = \"forever\"\n")),
        "6:11: \"forever\": expected a duration such as 500ms, 10s, 15m, 1h or 1d"
    );
    // An override inherits the limiter's lockout unless it gives its own.
    let o = format!("{base}lockout = \"15m\"\n[[limiter.override]]\nkey = \"ops\"\nlimit = 50\n");
    assert_ne!(
        PolicyFile::parse(&o, "x").unwrap(),
        PolicyFile::parse(&format!("{o}lockout = \"1m\"\n"), "x").unwrap()
    );
}
