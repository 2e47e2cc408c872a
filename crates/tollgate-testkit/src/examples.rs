//! The example binaries the black-box tests run.

use std::path::PathBuf;

/// The path of example `name` as built for the running test's profile (`target/<profile>/examples/<name>`).
///
/// # Panics
/// If the binary is missing: `scripts/test.sh` builds every example before the tests (`cargo test` alone does not
/// build a `test = true` example such as `fleet` as a binary).
pub fn example(name: &str) -> PathBuf {
    // Integration tests run from target/<profile>/deps.
    let exe = std::env::current_exe().expect("the test binary's path");
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join(name))
        .expect("target/<profile>/examples");
    assert!(
        path.exists(),
        "{} is missing: build the examples first (`cargo build --workspace --all-features --examples`, as \
         scripts/test.sh does)",
        path.display()
    );
    path
}
