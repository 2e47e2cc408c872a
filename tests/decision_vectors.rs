//! The shared decision vectors against the in-process store: every step's decision must equal the reference
//! model's (tests/vectors/generate.py), field for field. The Redis store runs the very same file.

use tollgate_core::MemoryStore;
use tollgate_testkit::vectors::Vectors;

#[test]
fn memory_store_matches_every_vector() {
    let vectors = Vectors::load();
    assert!(vectors.cases.len() >= 30, "the vector file lost cases");
    let mut steps = 0;
    for case in &vectors.cases {
        let store = MemoryStore::new();
        let policy = case.policy();
        for (i, step) in case.steps.iter().enumerate() {
            let got = if let Some(delta) = step.charge {
                store
                    .charge_at(&step.key, &policy, delta, step.decided_at(), step.at())
                    .unwrap()
            } else if step.peek {
                store.peek_at(&step.key, &policy, step.cost, step.at())
            } else {
                store
                    .check_at(&step.key, &policy, step.cost, step.at())
                    .unwrap()
            };
            assert_eq!(
                got,
                step.expected(&policy),
                "case {:?}, step {i}",
                case.name
            );
            steps += 1;
        }
    }
    assert!(steps > 500);
}

#[test]
fn vectors_cover_peeks_lockouts_and_charges_on_both_algorithms() {
    let vectors = Vectors::load();
    for algorithm in ["token_bucket", "sliding_window"] {
        let cases = || vectors.cases.iter().filter(|c| c.algorithm == algorithm);
        assert!(
            cases().flat_map(|c| &c.steps).any(|s| s.peek),
            "{algorithm}"
        );
        assert!(cases().any(|c| c.lockout_us.is_some()), "{algorithm}");
        let charges = || cases().flat_map(|c| &c.steps).filter_map(|s| s.charge);
        assert!(
            charges().any(|d| d > 0) && charges().any(|d| d < 0),
            "{algorithm}"
        );
    }
}

#[test]
fn vectors_cover_every_outcome_and_both_algorithms() {
    let vectors = Vectors::load();
    for algorithm in ["token_bucket", "sliding_window", "fixed_window"] {
        for outcome in ["allowed", "limited", "cost_exceeds_capacity"] {
            let n = vectors
                .cases
                .iter()
                .filter(|c| c.algorithm == algorithm)
                .flat_map(|c| &c.steps)
                .filter(|s| s.outcome == outcome)
                .count();
            assert!(n > 0, "no {outcome} step for {algorithm}");
        }
    }
}

/// The token lease vectors (tests/vectors/leases.json) against the in-process store, whose leases run the Rust
/// twins of the Lua lease scripts: every answer equals the reference model's. The Redis store runs the same file.
#[test]
fn memory_store_matches_every_lease_vector() {
    let vectors = tollgate_testkit::vectors::LeaseVectors::load();
    assert!(
        vectors.cases.len() >= 16,
        "the lease vector file lost cases"
    );
    let (mut leases, mut checks, mut partial) = (0, 0, 0);
    for case in &vectors.cases {
        let store = MemoryStore::new();
        let policy = case.policy();
        for (i, step) in case.steps.iter().enumerate() {
            if step.is_lease() {
                let got = store
                    .lease_tokens_at("k", &policy, &step.request(), step.at())
                    .unwrap();
                assert_eq!(got, step.expected_grant(), "case {:?}, step {i}", case.name);
                leases += 1;
                partial += usize::from(got.retry_after.is_some());
            } else {
                let got = store.check_at("k", &policy, step.cost, step.at()).unwrap();
                assert_eq!(
                    got,
                    step.expected_decision(&policy),
                    "case {:?}, step {i}",
                    case.name
                );
                checks += 1;
            }
        }
    }
    assert!(
        leases > 300 && checks > 150 && partial > 20,
        "{leases} {checks} {partial}"
    );
}
