//! The configuration loader against files of our own that cover every case envoyproxy/ratelimit's config tests
//! check: each kind of bad file rejected with the file, the place and the cause; every good one loaded; and the
//! limit each descriptor gets, with the stats key upstream names it by.

use std::path::{Path, PathBuf};

use tollgate_rls::config::{Algorithm, ConfigDir, Entry, LoadError, Loader, RateLimitConfig, Unit};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/config")
}

fn read(relative: &str) -> (String, String) {
    let text = std::fs::read_to_string(dir().join(relative)).unwrap();
    let name = Path::new(relative)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    (name, text)
}

fn load(files: &[&str]) -> Result<RateLimitConfig, LoadError> {
    Loader::new().load(files.iter().map(|f| read(f)))
}

fn good(file: &str) -> RateLimitConfig {
    load(&[&format!("good/{file}")]).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[track_caller]
fn rejected(files: &[&str], file: &str, line: u64, column: u64, cause: &str) {
    let err = load(files).expect_err("a bad file loads");
    assert_eq!(
        (err.file.as_str(), err.line, err.column),
        (file, line, column),
        "{err}"
    );
    assert!(err.cause.contains(cause), "{err} does not say {cause:?}");
    assert!(
        err.to_string()
            .starts_with(&format!("{file}:{line}:{column}: ")),
        "{err}"
    );
}

#[test]
fn every_kind_of_bad_file_is_rejected_with_its_place_and_cause() {
    rejected(
        &["bad/bad_unit.yaml"],
        "bad_unit.yaml",
        6,
        13,
        "invalid rate limit unit 'fortnight'",
    );
    rejected(
        &["bad/not_yaml.yaml"],
        "not_yaml.yaml",
        1,
        9,
        "error loading config file",
    );
    rejected(
        &["bad/duplicate_key.yaml"],
        "duplicate_key.yaml",
        6,
        10,
        "duplicate descriptor composite key 'edge.path_/login'",
    );
    rejected(
        &["bad/empty_domain.yaml"],
        "empty_domain.yaml",
        1,
        1,
        "config file cannot have empty domain",
    );
    rejected(
        &["bad/empty_key.yaml"],
        "empty_key.yaml",
        5,
        9,
        "descriptor has empty key",
    );
    rejected(
        &["bad/unknown_key.yaml"],
        "unknown_key.yaml",
        4,
        5,
        "config error, unknown key 'ratelimits'",
    );
    rejected(
        &["bad/unknown_nested_key.yaml"],
        "unknown_nested_key.yaml",
        6,
        7,
        "config error, unknown key 'request_per_unit'",
    );
    rejected(
        &["bad/list_of_strings.yaml"],
        "list_of_strings.yaml",
        3,
        5,
        "config error, yaml file contains list of type other than map: x",
    );
    rejected(
        &["bad/number_key.yaml"],
        "number_key.yaml",
        2,
        1,
        "config error, key is not of type string: 1.5",
    );
    rejected(
        &["bad/replaces_empty.yaml"],
        "replaces_empty.yaml",
        9,
        11,
        "should not have an empty replaces entry",
    );
    rejected(
        &["bad/replaces_self.yaml"],
        "replaces_self.yaml",
        9,
        17,
        "replaces should not contain name of same descriptor",
    );
    rejected(
        &["bad/unlimited_with_unit.yaml"],
        "unlimited_with_unit.yaml",
        6,
        13,
        "should not specify rate limit unit when unlimited",
    );
    rejected(
        &["bad/share_threshold_no_wildcard.yaml"],
        "share_threshold_no_wildcard.yaml",
        5,
        22,
        "share_threshold can only be used with wildcard values",
    );
    rejected(
        &["bad/bad_algorithm.yaml"],
        "bad_algorithm.yaml",
        2,
        12,
        "invalid algorithm 'leaky_bucket'",
    );
    rejected(
        &["bad/float_value.yaml"],
        "float_value.yaml",
        4,
        52,
        "cannot be a float",
    );
    rejected(
        &["bad/too_large.yaml"],
        "too_large.yaml",
        4,
        50,
        "cannot be computed exactly",
    );
    rejected(&["bad/not_a_map.yaml"], "not_a_map.yaml", 1, 1, "not a map");
}

#[test]
fn a_domain_in_two_files_is_an_error_unless_merged_and_a_key_twice_always() {
    rejected(
        &["merge/one.yaml", "merge/two.yaml"],
        "two.yaml",
        1,
        9,
        "duplicate domain 'merged' in config file",
    );
    let merged = Loader::new()
        .merge_domains(true)
        .load([read("merge/one.yaml"), read("merge/two.yaml")])
        .unwrap();
    let limit = |key| {
        merged
            .find("merged", &[Entry::new(key, "x")])
            .unwrap()
            .limit()
            .requests_per_unit()
    };
    assert_eq!((limit("a"), limit("b")), (10, 20));
    let twice = Loader::new()
        .merge_domains(true)
        .load([read("merge/one.yaml"), read("merge/one.yaml")])
        .unwrap_err();
    assert_eq!(twice.file, "one.yaml");
    assert!(
        twice
            .cause
            .contains("duplicate descriptor composite key 'merged.a'"),
        "{twice}"
    );
}

#[test]
fn a_directory_loads_every_yaml_file_in_path_order_skipping_hidden_ones() {
    let tmp = std::env::temp_dir().join(format!("tollgate-rls-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(tmp.join("sub")).unwrap();
    std::fs::create_dir_all(tmp.join("..data")).unwrap();
    for (name, domain) in [("a.yaml", "one"), ("sub/b.yml", "two")] {
        std::fs::write(tmp.join(name), format!("domain: {domain}\n")).unwrap();
    }
    // A ConfigMap's hidden copy and an editor's leftovers are not read.
    std::fs::write(tmp.join("..data/a.yaml"), "domain: one\n").unwrap();
    std::fs::write(tmp.join(".a.yaml.swp"), "not yaml: [").unwrap();
    std::fs::write(tmp.join("notes.txt"), "not yaml: [").unwrap();
    let config = ConfigDir::new(&tmp, Loader::new()).load().unwrap();
    assert_eq!(config.domains(), ["one", "two"]);
    assert_eq!(config.files(), 2);
    std::fs::write(tmp.join("sub/b.yml"), "domain: one\n").unwrap();
    let err = ConfigDir::new(&tmp, Loader::new()).load().unwrap_err();
    assert!(
        err.to_string()
            .starts_with("sub/b.yml:1:9: duplicate domain 'one'"),
        "{err}"
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}

fn find<'c>(
    config: &'c RateLimitConfig,
    domain: &str,
    entries: &[(&str, &str)],
) -> Option<tollgate_rls::config::Found<'c>> {
    let entries: Vec<Entry<'_>> = entries.iter().map(|(k, v)| Entry::new(k, v)).collect();
    config.find(domain, &entries)
}

#[track_caller]
fn limit_of(
    config: &RateLimitConfig,
    domain: &str,
    entries: &[(&str, &str)],
) -> (u32, Option<Unit>, String) {
    let found = find(config, domain, entries).unwrap_or_else(|| panic!("no limit for {entries:?}"));
    (
        found.limit().requests_per_unit(),
        found.limit().unit(),
        found.stats_key().to_owned(),
    )
}

#[test]
fn nesting_overrides_and_whitelisting_pick_the_limit_upstream_picks() {
    let c = good("nested.yaml");
    assert!(
        find(&c, "other-domain", &[("path", "/")]).is_none(),
        "an unknown domain"
    );
    assert!(find(&c, "shop", &[]).is_none(), "no entries");
    // A level with no limit of its own, and a request that stops there.
    assert!(find(&c, "shop", &[("tenant", "acme")]).is_none());
    assert!(find(&c, "shop", &[("tenant", "other")]).is_none());
    // A key nobody configured, and a deeper request than the configuration (the limit sits at another depth).
    assert!(find(&c, "shop", &[("unknown", "x")]).is_none());
    assert!(find(&c, "shop", &[("path", "/a"), ("more", "x")]).is_none());
    assert_eq!(
        limit_of(&c, "shop", &[("tenant", "acme"), ("user", "ann")]),
        (5, Some(Unit::Second), "shop.tenant_acme.user".into())
    );
    assert_eq!(
        limit_of(&c, "shop", &[("tenant", "acme"), ("user", "vip")]),
        (50, Some(Unit::Second), "shop.tenant_acme.user_vip".into())
    );
    assert_eq!(
        limit_of(&c, "shop", &[("path", "/cart")]),
        (100, Some(Unit::Minute), "shop.path".into())
    );
    assert_eq!(
        limit_of(&c, "shop", &[("path", "/checkout")]),
        (10, Some(Unit::Minute), "shop.path_/checkout".into())
    );
    // Whitelisted: the value with no limit wins over the key's default.
    assert!(find(&c, "shop", &[("path", "/health")]).is_none());
    assert_eq!(
        limit_of(&c, "shop", &[("region", "eu")]),
        (3, Some(Unit::Hour), "shop.region".into())
    );
    let named = find(&c, "shop", &[("api_key", "k1")]).unwrap();
    assert_eq!(
        (named.limit().name(), named.limit().unit()),
        ("per-api-key", Some(Unit::Day))
    );
    assert!(
        find(&c, "shop", &[("region", "eu")])
            .unwrap()
            .limit()
            .name()
            .is_empty()
    );
    let unlimited = find(&c, "shop", &[("internal", "batch")]).unwrap();
    assert!(unlimited.limit().unlimited() && unlimited.limit().policy().is_none());
    // A limit on a value, and another below it: each applies at its own depth only.
    assert_eq!(limit_of(&c, "shop", &[("plan", "free")]).0, 20);
    assert_eq!(
        limit_of(&c, "shop", &[("plan", "free"), ("feature", "export")]).0,
        2
    );
    assert!(find(&c, "shop", &[("plan", "free"), ("feature", "import")]).is_none());
    // detailed_metric: the request's own values name the limit.
    assert_eq!(
        limit_of(&c, "shop", &[("client", "c-1")]),
        (60, Some(Unit::Minute), "shop.client_c-1".into())
    );
    assert_eq!(
        limit_of(&c, "shop", &[("client", "c-2")]).2,
        "shop.client_c-2"
    );
    // Every unit upstream accepts, in any case.
    assert_eq!(limit_of(&c, "shop", &[("week", "w")]).1, Some(Unit::Week));
    assert_eq!(limit_of(&c, "shop", &[("month", "m")]).1, Some(Unit::Month));
    assert_eq!(limit_of(&c, "shop", &[("year", "y")]).1, Some(Unit::Year));
}

#[test]
fn shadow_mode_is_per_descriptor() {
    let c = good("shadow.yaml");
    let shadow =
        |entries: &[(&str, &str)]| find(&c, "shadow", entries).unwrap().limit().shadow_mode();
    assert!(!shadow(&[("tenant", "acme"), ("user", "ann")]));
    assert!(shadow(&[("tenant", "acme"), ("user", "trial")]));
    assert!(shadow(&[("path", "/any")]));
    assert!(!shadow(&[("path", "/enforced")]));
}

#[test]
fn wildcards_match_prefixes_middles_and_several_stars_exact_values_first() {
    let c = good("wildcard.yaml");
    assert_eq!(
        limit_of(&c, "wild", &[("path", "/api/users")]),
        (20, Some(Unit::Minute), "wild.path_/api/*".into())
    );
    assert_eq!(
        limit_of(&c, "wild", &[("path", "/api/")]).0,
        20,
        "* matches the empty string"
    );
    assert_eq!(
        limit_of(&c, "wild", &[("path", "/api/exact")]).0,
        1,
        "an exact value wins"
    );
    assert!(find(&c, "wild", &[("path", "/other")]).is_none());
    assert!(
        find(&c, "wild", &[("exact", "food")]).is_none(),
        "a value without * is exact"
    );
    assert_eq!(
        limit_of(&c, "wild", &[("middle", "v2-beta")]).2,
        "wild.middle_v*-beta"
    );
    assert_eq!(limit_of(&c, "wild", &[("middle", "v-beta")]).0, 20);
    assert!(find(&c, "wild", &[("middle", "v2-alpha")]).is_none());
    assert!(find(&c, "wild", &[("middle", "xv2-beta")]).is_none());
    assert_eq!(
        limit_of(&c, "wild", &[("many", "a1b2c")]).2,
        "wild.many_a*b*c"
    );
    assert_eq!(limit_of(&c, "wild", &[("many", "abc")]).0, 10);
    assert!(
        find(&c, "wild", &[("many", "a1c2b")]).is_none(),
        "segments in order"
    );
    assert_eq!(
        limit_of(&c, "wild", &[("tenant", "acme"), ("path", "/static/x.css")]).2,
        "wild.tenant_acme.path_/static/*"
    );
    // Without share_threshold every value matching a wildcard has a counter of its own; with it, one shared.
    let own = find(&c, "wild", &[("path", "/api/a")]).unwrap();
    assert_eq!(own.counted_value(0, "/api/a"), "/api/a");
    let shared = find(&c, "wild", &[("shared", "files/a.pdf")]).unwrap();
    assert_eq!(shared.counted_value(0, "files/a.pdf"), "files/*");
    assert_eq!(shared.stats_key(), "wild.shared_files/*");
    // value_to_metric: the request's value in the stats key.
    assert_eq!(
        limit_of(&c, "wild", &[("route", "r42")]).2,
        "wild.route_r42"
    );
}

#[test]
fn replaces_names_and_metadata_quota_mode_and_algorithms_load() {
    let c = good("replaces.yaml");
    let vip = find(&c, "replace", &[("vip", "v")]).unwrap();
    assert_eq!(vip.limit().replaces(), ["per-user"]);
    assert_eq!(
        find(&c, "replace", &[("user", "u")])
            .unwrap()
            .limit()
            .name(),
        "per-user"
    );
    let m = good("metadata.yaml");
    let user = find(&m, "meta", &[("user", "ann")]).unwrap();
    assert!(user.limit().quota_mode());
    assert_eq!(
        user.stats_key(),
        "meta.user_ann",
        "value_to_metric on a key-only match"
    );
    let a = good("algorithms.yaml");
    let algorithm = |key| find(&a, "algo", &[(key, "x")]).unwrap().limit().algorithm();
    assert_eq!(
        algorithm("upstream_like"),
        Algorithm::FixedWindow,
        "the file's"
    );
    assert_eq!(algorithm("bucket"), Algorithm::TokenBucket);
    assert_eq!(algorithm("sliding"), Algorithm::SlidingWindowCounter);
    let n = good("nested.yaml");
    assert_eq!(
        find(&n, "shop", &[("path", "/")])
            .unwrap()
            .limit()
            .algorithm(),
        Algorithm::SlidingWindowCounter,
        "tollgate's default"
    );
    let fixed = Loader::new()
        .default_algorithm(Algorithm::FixedWindow)
        .load([read("good/nested.yaml")])
        .unwrap();
    assert_eq!(
        find(&fixed, "shop", &[("path", "/")])
            .unwrap()
            .limit()
            .algorithm(),
        Algorithm::FixedWindow
    );
}

#[test]
fn every_good_file_loads_and_an_empty_directory_is_empty() {
    let config = ConfigDir::new(dir().join("good"), Loader::new())
        .load()
        .unwrap();
    assert_eq!(
        config.domains(),
        ["algo", "meta", "replace", "shadow", "shop", "wild"]
    );
    assert!(
        Loader::new()
            .load::<[(&str, &str); 0], _, _>([])
            .unwrap()
            .is_empty()
    );
}
