//! The study's figures as one JSON object (`--json`), through `serde_json`.

use serde::Serialize;

use crate::report::Setup;
use crate::tally::{Estimates, Tally};
use crate::trace::Class;

/// The whole study: the setup, then each class's figures and the total.
#[derive(Serialize)]
struct Study {
    seed: u64,
    limit: u64,
    period_us: u64,
    windows: u64,
    edge_us: u64,
    clients: usize,
    seconds: f64,
    classes: Classes,
    total: ClassFigures,
}

/// Each class's figures by its name, in the study's order.
struct Classes(Vec<(&'static str, ClassFigures)>);

impl Serialize for Classes {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(name, figures)| (name, figures)))
    }
}

/// One class's (or the total's) counts.
#[derive(Serialize)]
struct ClassFigures {
    clients: usize,
    requests: u64,
    log_allowed: u64,
    counter_allowed: u64,
    bucket_allowed: u64,
    cloudflare_method: EstimateFigures,
    sources_over: u64,
    sources_missed: u64,
    missed_peak: u64,
    sources_wrongly_flagged: u64,
    enforcing_shadow: EstimateFigures,
    counter_peak: u64,
    independent_counter_only: u64,
    independent_log_only: u64,
    bucket_only: u64,
    log_only_vs_bucket: u64,
    bucket_over_window: u64,
    bucket_under_window: u64,
    bucket_peak: u64,
}

/// How an estimate compares with the exact log.
#[derive(Serialize)]
struct EstimateFigures {
    wrongly_allowed: u64,
    wrongly_denied: u64,
    denied_one_short: u64,
    weighted_rel_error: f64,
    mean_abs_rel_error: f64,
    mean_signed_rel_error: f64,
    mean_abs_rel_error_busy: f64,
    worst_undercount: Undercount,
}

/// The largest undercount seen.
#[derive(Serialize)]
struct Undercount {
    amount: f64,
    exact: u64,
    estimate: f64,
    elapsed_us: u64,
}

/// `x` to `digits` decimals, as the tables print it (the JSON says no more than the study measures).
fn rounded(x: f64, digits: i32) -> f64 {
    let scale = 10_f64.powi(digits);
    (x * scale).round() / scale
}

impl EstimateFigures {
    fn of(e: &Estimates) -> Self {
        let w = e.worst_undercount;
        Self {
            wrongly_allowed: e.wrongly_allowed,
            wrongly_denied: e.wrongly_denied,
            denied_one_short: e.denied_one_short,
            weighted_rel_error: rounded(e.weighted_rel_error(), 6),
            mean_abs_rel_error: rounded(e.mean_abs_rel_error(), 6),
            mean_signed_rel_error: rounded(e.mean_signed_rel_error(), 6),
            mean_abs_rel_error_busy: rounded(e.mean_busy_abs_rel_error(), 6),
            worst_undercount: Undercount {
                amount: rounded(w.amount, 3),
                exact: w.exact,
                estimate: rounded(w.estimate, 3),
                elapsed_us: w.elapsed_us,
            },
        }
    }
}

impl ClassFigures {
    fn of(t: &Tally, clients: usize) -> Self {
        Self {
            clients,
            requests: t.requests,
            log_allowed: t.log_allowed,
            counter_allowed: t.counter_allowed,
            bucket_allowed: t.bucket_allowed,
            cloudflare_method: EstimateFigures::of(&t.offered),
            sources_over: t.sources_over,
            sources_missed: t.sources_missed,
            missed_peak: t.missed_peak,
            sources_wrongly_flagged: t.sources_wrongly_flagged,
            enforcing_shadow: EstimateFigures::of(&t.enforced),
            counter_peak: t.counter_peak,
            independent_counter_only: t.counter_only,
            independent_log_only: t.log_only_vs_counter,
            bucket_only: t.bucket_only,
            log_only_vs_bucket: t.log_only_vs_bucket,
            bucket_over_window: t.bucket_over_window,
            bucket_under_window: t.bucket_under_window,
            bucket_peak: t.bucket_peak,
        }
    }
}

/// The same figures as one JSON object.
pub(crate) fn render(setup: &Setup<'_>, classes: &[(Class, Tally)], total: &Tally) -> String {
    let study = Study {
        seed: setup.seed,
        limit: setup.limit,
        period_us: setup.period_us,
        windows: setup.windows,
        edge_us: setup.trace.edge_us,
        clients: setup.trace.classes.len(),
        seconds: rounded(setup.seconds, 3),
        classes: Classes(
            classes
                .iter()
                .map(|(class, t)| {
                    (
                        class.name(),
                        ClassFigures::of(t, setup.trace.clients_of(*class)),
                    )
                })
                .collect(),
        ),
        total: ClassFigures::of(total, setup.trace.classes.len()),
    };
    serde_json::to_string(&study).expect("plain numbers and names serialize")
}
