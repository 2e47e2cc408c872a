//! `examples/fleet --plot FILE.svg` as a black box: a short real run (on a private Redis, so every design is
//! measured), its chart parsed as XML: one line per design, with a point for every measured second.

use std::ffi::OsStr;

use tollgate_testkit::redis::RedisServer;

use tollgate_testkit::examples::run_example;

/// Runs the fleet with `args` and `--plot`; the chart's polylines as point counts, and the run's stdout.
fn plotted(name: &str, args: &[&str]) -> (Vec<usize>, String) {
    let redis = RedisServer::start();
    let svg =
        std::env::temp_dir().join(format!("tollgate-fleet-{}-{name}.svg", std::process::id()));
    let url = redis.url();
    let args = args.iter().map(OsStr::new).chain([
        OsStr::new("--redis-url"),
        OsStr::new(&url),
        OsStr::new("--plot"),
        svg.as_os_str(),
    ]);
    let out = run_example("fleet", args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.stderr.is_empty(),
        "no progress line when stderr is not a terminal: {:?}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&svg).expect("the chart was written");
    let _ = std::fs::remove_file(&svg);
    let doc = roxmltree::Document::parse(&text).expect("the chart is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let lines = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .map(|n| {
            n.attribute("points")
                .unwrap_or("")
                .split_whitespace()
                .count()
        })
        .collect();
    (lines, stdout)
}

#[test]
fn the_chart_has_a_line_per_design_and_a_point_per_second() {
    let (lines, stdout) = plotted(
        "fixed",
        &[
            "--instances",
            "2",
            "--limit",
            "20",
            "--duration",
            "3s",
            "--warmup",
            "1s",
        ],
    );
    // Baseline, then both algorithms on in-process, Redis and Redis + leases; the limit and the legend's samples
    // are two-point lines.
    assert_eq!(
        lines.iter().filter(|&&points| points == 3).count(),
        7,
        "{lines:?}\n{stdout}"
    );
    assert!(stdout.contains("chart: "), "{stdout}");
}

#[test]
fn the_autoscale_chart_adds_the_instances() {
    let (lines, stdout) = plotted(
        "autoscale",
        &[
            "--autoscale",
            "--instances",
            "3",
            "--limit",
            "20",
            "--duration",
            "3s",
            "--warmup",
            "1s",
        ],
    );
    // In-process and Redis, and the instance count.
    assert_eq!(
        lines.iter().filter(|&&points| points == 3).count(),
        3,
        "{lines:?}\n{stdout}"
    );
}
