//! Both algorithms on the in-process store, with the decisions they print.
//!
//! `cargo run --release --example quickstart`
//!
//! A client sends 8 requests at once, then 5 more over the next 1.4 s, to a limit of 5 per second: the token
//! bucket admits its burst and then one request per 200 ms; the sliding window admits 5 in the window and
//! weighs the previous window as the next one begins.

use std::time::Duration;

use tollgate::{ManualClock, MemoryStore, Policy, Quota, Timestamp};

#[path = "common/cli.rs"]
mod cli;

/// The command line: no flags (`--help` says what it shows).
#[derive(clap::Parser)]
#[command(
    name = "quickstart",
    about = "Both algorithms on the in-process store, with the decisions they print"
)]
struct Flags {}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Flags {} = cli::parse();
    let quota = Quota::per_second(5)?;
    let policies = [
        ("token bucket", Policy::token_bucket(quota)),
        ("sliding window", Policy::sliding_window(quota)?),
    ];
    for (name, policy) in policies {
        // A manual clock makes the run repeatable: the printed times are exact.
        let start = Timestamp::from_micros(1_700_000_000_000_000);
        let clock = ManualClock::new(start);
        let store = MemoryStore::builder().clock(clock.clone()).build();
        println!("{name}: 5 per second");
        println!(
            "  {:>8}  {:<8} {:>9} {:>9} {:>11}",
            "t", "outcome", "remaining", "reset in", "retry after"
        );
        let schedule = [0u64, 0, 0, 0, 0, 0, 0, 0, 200, 400, 600, 1_200, 1_400];
        let mut elapsed = 0;
        for at in schedule {
            clock.advance(Duration::from_millis(at - elapsed));
            elapsed = at;
            let d = store.check_now("client-42", &policy, 1)?;
            let retry = d
                .retry_after
                .map_or_else(|| "-".to_owned(), |r| format!("{r:?}"));
            println!(
                "  {:>6}ms  {:<8} {:>9} {:>9} {:>11}",
                at,
                d.outcome.as_str(),
                d.remaining,
                format!("{:?}", d.reset_after()),
                retry
            );
        }
        println!();
    }
    Ok(())
}
