//! The study's figures as one JSON object (`--json`), written by hand to keep the example dependency-free.

use std::fmt::Write as _;

use crate::report::Setup;
use crate::tally::{Estimates, Tally};
use crate::trace::Class;

/// The same figures as one JSON object.
pub(crate) fn render(setup: &Setup<'_>, classes: &[(Class, Tally)], total: &Tally) -> String {
    let mut out = String::from("{");
    let _ = write!(
        out,
        "\"seed\":{},\"limit\":{},\"period_us\":{},\"windows\":{},\"edge_us\":{},\"clients\":{},\"seconds\":{:.3},",
        setup.seed,
        setup.limit,
        setup.period_us,
        setup.windows,
        setup.trace.edge_us,
        setup.trace.classes.len(),
        setup.seconds
    );
    out.push_str("\"classes\":{");
    for (i, (class, t)) in classes.iter().enumerate() {
        let sep = if i > 0 { "," } else { "" };
        let _ = write!(
            out,
            "{sep}\"{}\":{}",
            class.name(),
            tally_json(t, setup.trace.clients_of(*class))
        );
    }
    let _ = write!(
        out,
        "}},\"total\":{}}}",
        tally_json(total, setup.trace.classes.len())
    );
    out
}

fn estimates_json(e: &Estimates) -> String {
    let w = e.worst_undercount;
    format!(
        "{{\"wrongly_allowed\":{},\"wrongly_denied\":{},\"denied_one_short\":{},\"weighted_rel_error\":{:.6},\"mean_abs_rel_error\":{:.6},\"mean_signed_rel_error\":{:.6},\
         \"mean_abs_rel_error_busy\":{:.6},\"worst_undercount\":{{\"amount\":{:.3},\"exact\":{},\"estimate\":{:.3},\
         \"elapsed_us\":{}}}}}",
        e.wrongly_allowed,
        e.wrongly_denied,
        e.denied_one_short,
        e.weighted_rel_error(),
        e.mean_abs_rel_error(),
        e.mean_signed_rel_error(),
        e.mean_busy_abs_rel_error(),
        w.amount,
        w.exact,
        w.estimate,
        w.elapsed_us,
    )
}

fn tally_json(t: &Tally, clients: usize) -> String {
    format!(
        "{{\"clients\":{clients},\"requests\":{},\"log_allowed\":{},\"counter_allowed\":{},\"bucket_allowed\":{},\
         \"cloudflare_method\":{},\"sources_over\":{},\"sources_missed\":{},\"missed_peak\":{},\"sources_wrongly_flagged\":{},\
         \"enforcing_shadow\":{},\"counter_peak\":{},\"independent_counter_only\":{},\"independent_log_only\":{},\
         \"bucket_only\":{},\"log_only_vs_bucket\":{},\"bucket_over_window\":{},\"bucket_under_window\":{},\
         \"bucket_peak\":{}}}",
        t.requests,
        t.log_allowed,
        t.counter_allowed,
        t.bucket_allowed,
        estimates_json(&t.offered),
        t.sources_over,
        t.sources_missed,
        t.missed_peak,
        t.sources_wrongly_flagged,
        estimates_json(&t.enforced),
        t.counter_peak,
        t.counter_only,
        t.log_only_vs_counter,
        t.bucket_only,
        t.log_only_vs_bucket,
        t.bucket_over_window,
        t.bucket_under_window,
        t.bucket_peak,
    )
}
