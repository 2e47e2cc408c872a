//! `examples/fleet --scenario cluster-faults` as a black box: a private Redis Cluster of 3 primaries and 3
//! replicas failed over, resharded and stripped of a primary while 4 instances decide on it, read from `--json`.

use serde_json::Value;
use tollgate_testkit::examples::run_example;
use tollgate_testkit::redis::CLUSTER_NODE_TIMEOUT;

fn num(row: &Value, field: &str) -> f64 {
    row[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} in {row}"))
}

#[test]
fn failover_resharding_and_a_killed_primary_under_load() {
    let out = run_example("fleet", ["--scenario", "cluster-faults", "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let rows: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let faults: Vec<&str> = rows.iter().map(|r| r["fault"].as_str().unwrap()).collect();
    assert_eq!(faults, ["failover", "reshard", "kill"]);
    for row in &rows {
        // The hot key was over its limit throughout, and never admitted past what its bucket can give.
        assert!(
            num(row, "admitted") > 0.0 && row["answers"]["429"].as_f64() > Some(0.0),
            "{row}"
        );
        assert!(num(row, "admitted") <= num(row, "bound"), "{row}");
    }
    // A failover (the old primary demoted under the instances' connections) costs no decision.
    assert_eq!(num(&rows[0], "errors"), 0.0, "{}", rows[0]);
    assert_eq!(num(&rows[0], "cold_errors"), 0.0, "{}", rows[0]);
    // A reshard (ASK while the hot slot moves, MOVED after it) loses no key's state (the bound above) and costs
    // at most a few decisions while the hot key itself is migrated (seen: 0 to 2 of some 1 800), never an error
    // loop: none in the phase's last second.
    let reshard = &rows[1];
    let hot_answers = num(&reshard["answers"], "200") + num(&reshard["answers"], "429");
    assert!(num(reshard, "errors") * 100.0 < hot_answers, "{reshard}");
    assert!(
        num(reshard, "resume_s") < num(reshard, "phase_s") - 1.0,
        "{reshard}"
    );
    // A killed primary: answered by the failure policy (503) until its replica takes over, then decided again
    // soon after (the retries wait at most 100 ms, each after a new slot map), and no error loop after that.
    let kill = &rows[2];
    assert!(
        num(kill, "errors") > 0.0,
        "the kill cost no decision: {kill}"
    );
    let after_promotion = num(kill, "resume_s") - num(kill, "promoted_s");
    assert!(
        after_promotion < CLUSTER_NODE_TIMEOUT.as_secs_f64(),
        "decisions resumed {after_promotion:.3} s after the promotion: {kill}"
    );
    assert!(num(kill, "resume_s") < num(kill, "phase_s") - 1.0, "{kill}");
}
