//! `examples/overload` in its fast mode (two steps of one second), as CI runs it: the JSON has a row for every
//! design and load, with every field, and at half the capacity every design admits every request.
//!
//! Timing is the machine's, so nothing here asserts a figure that depends on it beyond what the load makes
//! certain: the pool is large (64 workers × 320 ms: 200 req/s) so that at 0.5× the 32 requests in flight stay far
//! below every design's line even through a stall of the scheduler, and at 3× every protecting design must turn
//! some requests away (in flight reaches its ceiling within a fraction of the step).

use std::process::Command;

use tollgate_testkit::examples::example;

const DESIGNS: [&str; 5] = [
    "no protection",
    "static concurrency limit",
    "worker shedder",
    "adaptive gradient2",
    "adaptive aimd",
];

#[test]
fn fast_mode_reports_every_design_and_load_and_half_load_admits_everything() {
    let out = Command::new(example("overload"))
        .args(["--steps", "0.5,3", "--step-duration", "1s", "--json"])
        .args([
            "--workers",
            "64",
            "--service-time",
            "320ms",
            "--deadline",
            "4s",
        ])
        .output()
        .expect("run the example");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "overload failed: {stderr}");
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not a JSON array ({e}): {stderr}"));
    assert_eq!(rows.len(), DESIGNS.len() * 2, "{rows:#?}");
    for design in DESIGNS {
        for load in [0.5, 3.0] {
            let row = rows
                .iter()
                .find(|r| r["design"] == design && r["load"].as_f64() == Some(load))
                .unwrap_or_else(|| panic!("no row for {design} at {load}×: {rows:#?}"));
            for field in [
                "goodput",
                "critical_success",
                "admitted",
                "p50_ms",
                "p99_ms",
            ] {
                let v = row[field]
                    .as_f64()
                    .unwrap_or_else(|| panic!("{field} in {row}"));
                assert!(v.is_finite() && v >= 0.0, "{field} in {row}");
            }
            // Shares of the step's requests: at most all of them.
            for share in ["critical_success", "admitted"] {
                assert!(row[share].as_f64().unwrap() <= 1.0, "{share} in {row}");
            }
            // Goodput counts the answers that came within the step: each of the 64 workers gives at most
            // ⌊1 s ÷ 320 ms⌋ + 1 = 4 answers in one second (one begun in the step before), against a capacity of
            // 200 per second.
            let most = 64.0 * 4.0 / 200.0;
            assert!(row["goodput"].as_f64().unwrap() <= most, "goodput in {row}");
            let sent = row["sent"].as_u64().unwrap();
            assert!(sent > 50, "{row}");
            let admitted = row["admitted"].as_f64().unwrap();
            if load == 0.5 {
                assert_eq!(admitted, 1.0, "false shedding at half the capacity: {row}");
                assert_eq!(row["critical_success"].as_f64(), Some(1.0), "{row}");
            } else if design == "no protection" {
                assert_eq!(admitted, 1.0, "nothing to turn requests away: {row}");
            } else {
                assert!(
                    admitted < 1.0,
                    "at 3× capacity {design} turned nothing away: {row}"
                );
            }
        }
    }
}

#[test]
fn bad_flags_are_clear_errors() {
    for args in [
        &["--steps", "0"][..],
        &["--steps", "1,x"],
        &["--step-duration", "5x"],
        &["--workers", "0"],
        &["--workers", "100000", "--service-time", "1ms"],
        &["--no-such-flag"],
    ] {
        let out = Command::new(example("overload"))
            .args(args)
            .output()
            .expect("run the example");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.starts_with("overload: "), "{args:?}: {stderr:?}");
    }
    let help = Command::new(example("overload"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("--step-duration"));
}
