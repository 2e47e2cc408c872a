//! Renders the study as tables next to Cloudflare's published figures, or as JSON.

use std::fmt::Write as _;

use crate::tally::{Estimates, Tally};
use crate::trace::{Class, Trace};

/// Cloudflare, "How we built rate limiting capable of scaling to millions of domains" (2017).
const CF_TRACE: &str = "400,000,000 / 270,000";

/// What the report needs besides the tallies.
#[derive(Debug)]
pub(crate) struct Setup<'a> {
    pub(crate) seed: u64,
    pub(crate) limit: u64,
    pub(crate) period_us: u64,
    pub(crate) windows: u64,
    pub(crate) trace: &'a Trace,
    pub(crate) seconds: f64,
}

/// `1234567` → `1,234,567`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// `part` of `whole` in percent, 3 decimals (0 when `whole` is 0).
pub(crate) fn percent(part: u64, whole: u64) -> String {
    let p = if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    };
    format!("{p:.3} %")
}

fn secs(us: u64) -> String {
    let s = us as f64 / 1e6;
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.3} s")
    }
}

/// Rows of `label | this trace | Cloudflare`.
fn rows(out: &mut String, rows: &[(&str, String, &str)]) {
    for (label, ours, theirs) in rows {
        let line = format!("  {label:<52} {ours:<26} {theirs}");
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

fn share(part: u64, whole: u64) -> String {
    format!("{} ({})", percent(part, whole), thousands(part))
}

fn pct(fraction: f64) -> String {
    format!("{:.2} %", 100.0 * fraction)
}

fn times_limit(n: u64, limit: u64) -> String {
    format!("{n} = {:.2} x limit", n as f64 / limit as f64)
}

fn undercount(e: &Estimates, limit: u64) -> [(&'static str, String, &'static str); 2] {
    let w = e.worst_undercount;
    let amount = format!(
        "{:.1} = {:.1} % of limit",
        w.amount,
        100.0 * w.amount / limit as f64
    );
    let (exact, estimate, at) = (w.exact, w.estimate, secs(w.elapsed_us));
    let detail = format!("(exact {exact}, estimate {estimate:.1}, {at} into the window)");
    [
        ("worst undercount, edge-burst clients", amount, ""),
        ("", detail, ""),
    ]
}

/// The human-readable report.
pub(crate) fn text(setup: &Setup<'_>, classes: &[(Class, Tally)], total: &Tally) -> String {
    let (limit, trace) = (setup.limit, setup.trace);
    let clients = |class| thousands(trace.clients_of(class) as u64);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "tollgate accuracy study: sliding window counter and token bucket vs the exact sliding log\n\
         trace: seed {} | {} requests | {} clients ({} edge-burst, {} near-limit, {} heavy-tailed)",
        setup.seed,
        thousands(total.requests),
        thousands(trace.classes.len() as u64),
        clients(Class::EdgeBurst),
        clients(Class::NearLimit),
        clients(Class::HeavyTailed),
    );
    let _ = writeln!(
        out,
        "       limit {limit} per {} | {} windows | edge bursts in the last {} of a window | ran in {:.2} s\n",
        secs(setup.period_us),
        setup.windows,
        secs(trace.edge_us),
        setup.seconds,
    );
    let class = |wanted| {
        classes
            .iter()
            .find(|(c, _)| *c == wanted)
            .map_or(total, |(_, t)| t)
    };
    let sources = trace.classes.len() as u64;
    cloudflare_method(
        &mut out,
        total,
        class(Class::HeavyTailed),
        class(Class::EdgeBurst),
        sources,
        limit,
    );
    enforcing(&mut out, total, class(Class::EdgeBurst), limit);
    by_class(&mut out, classes, total, trace);
    bucket(&mut out, total, limit, setup.period_us);
    out.push_str(DEFINITIONS);
    out
}

fn cloudflare_method(
    out: &mut String,
    total: &Tally,
    heavy: &Tally,
    edge: &Tally,
    sources: u64,
    limit: u64,
) {
    let (n, e) = (total.requests, &total.offered);
    let missed = match total.sources_missed {
        0 => "0".to_owned(),
        m => format!(
            "{m}, at most {:.2} x limit",
            total.missed_peak as f64 / limit as f64
        ),
    };
    out.push_str(
        "1. Cloudflare's method: the counter counts every request; a request is over when the count with it\n   \
         exceeds the limit. Compared with the exact count of every request in the rolling period.\n",
    );
    rows(
        out,
        &[
            ("", "this trace".into(), "Cloudflare (published)"),
            (
                "requests / sources",
                format!("{} / {}", thousands(n), thousands(sources)),
                CF_TRACE,
            ),
            (
                "requests decided differently",
                percent(e.wrong(), n),
                "0.003 %",
            ),
            (
                "  wrongly allowed (estimate under, exact over)",
                share(e.wrongly_allowed, n),
                "",
            ),
            (
                "  wrongly denied = false positives",
                share(e.wrongly_denied, n),
                "0",
            ),
            (
                "  heavy-tailed clients only",
                percent(heavy.offered.wrong(), heavy.requests),
                "",
            ),
            (
                "mean relative error |estimate - exact| / exact",
                pct(e.mean_abs_rel_error()),
                "6 %",
            ),
            (
                "  ... only where exact >= limit / 2",
                pct(e.mean_busy_abs_rel_error()),
                "",
            ),
            (
                "  weighted: sum |estimate - exact| / sum exact",
                pct(e.weighted_rel_error()),
                "",
            ),
            (
                "mean signed error (estimate - exact) / exact",
                pct(e.mean_signed_rel_error()),
                "",
            ),
            (
                "sources ever over the limit",
                thousands(total.sources_over),
                "",
            ),
            (
                "  ... never flagged (false negatives)",
                missed,
                "3, all < 15 % over",
            ),
            (
                "sources flagged, never over (false positives)",
                thousands(total.sources_wrongly_flagged),
                "0",
            ),
        ],
    );
    rows(out, &undercount(&edge.offered, limit));
    out.push('\n');
}

fn enforcing(out: &mut String, total: &Tally, edge: &Tally, limit: u64) {
    let (n, e) = (total.requests, &total.enforced);
    out.push_str(
        "2. tollgate enforcing: the counter counts only what it admits. Shadow replay: the exact log holds the\n   \
         counter's admissions, so both judge the same history.\n",
    );
    rows(
        out,
        &[
            ("requests decided differently", percent(e.wrong(), n), ""),
            (
                "  wrongly allowed (counter admits, exact denies)",
                share(e.wrongly_allowed, n),
                "",
            ),
            (
                "  wrongly denied (counter denies, exact admits)",
                share(e.wrongly_denied, n),
                "",
            ),
            (
                "    ... with the exact count at limit - 1",
                share(e.denied_one_short, n),
                "",
            ),
            (
                "mean relative error |estimate - exact| / exact",
                pct(e.mean_abs_rel_error()),
                "",
            ),
            (
                "  ... only where exact >= limit / 2",
                pct(e.mean_busy_abs_rel_error()),
                "",
            ),
            (
                "  weighted: sum |estimate - exact| / sum exact",
                pct(e.weighted_rel_error()),
                "",
            ),
        ],
    );
    rows(out, &undercount(&edge.enforced, limit));
    let ratio = total.counter_allowed as f64 / total.log_allowed.max(1) as f64;
    let (ours, theirs) = (
        thousands(total.counter_allowed),
        thousands(total.log_allowed),
    );
    let indep = total.counter_only + total.log_only_vs_counter;
    rows(
        out,
        &[
            (
                "most counter-admitted requests in one rolling period",
                times_limit(total.counter_peak, limit),
                "",
            ),
            (
                "independent replay (the log decides on its own):",
                String::new(),
                "",
            ),
            ("requests decided differently", percent(indep, n), ""),
            (
                "  counter admits, log denies",
                share(total.counter_only, n),
                "",
            ),
            (
                "  log admits, counter denies",
                share(total.log_only_vs_counter, n),
                "",
            ),
            (
                "admitted, counter vs log",
                format!("{ours} vs {theirs} = {ratio:.4}"),
                "",
            ),
        ],
    );
    out.push('\n');
}

fn by_class(out: &mut String, classes: &[(Class, Tally)], total: &Tally, trace: &Trace) {
    out.push_str(
        "3. By client class (% of the class's requests; undercount and peak in requests)\n",
    );
    let _ = writeln!(
        out,
        "  {:<13}{:>8}{:>11}{:>11}{:>11}{:>11}{:>9}{:>11}{:>10}{:>9}{:>7}{:>7}",
        "class",
        "clients",
        "requests",
        "log-denied",
        "CF differ",
        "CF err",
        "differ",
        "wrong-adm",
        "wrong-den",
        "err",
        "under",
        "peak"
    );
    let all = [(None, total)];
    for (class, t) in classes.iter().map(|(c, t)| (Some(*c), t)).chain(all) {
        let clients = class.map_or(trace.classes.len(), |c| trace.clients_of(c)) as u64;
        let n = t.requests;
        let pct = |part| percent(part, n).trim_end_matches(" %").to_owned();
        let _ = writeln!(
            out,
            "  {:<13}{:>8}{:>11}{:>11}{:>11}{:>11}{:>9}{:>11}{:>10}{:>9}{:>7.1}{:>7}",
            class.map_or("all", Class::name),
            thousands(clients),
            thousands(n),
            pct(n - t.log_allowed),
            pct(t.offered.wrong()),
            self::pct(t.offered.mean_abs_rel_error()),
            pct(t.enforced.wrong()),
            pct(t.enforced.wrongly_allowed),
            pct(t.enforced.wrongly_denied),
            self::pct(t.enforced.mean_abs_rel_error()),
            t.enforced.worst_undercount.amount,
            t.counter_peak,
        );
    }
    out.push('\n');
}

fn bucket(out: &mut String, total: &Tally, limit: u64, period_us: u64) {
    let n = total.requests;
    let _ = writeln!(
        out,
        "4. Token bucket (burst = limit = {limit}, refill {limit} per {}) vs the exact sliding log",
        secs(period_us)
    );
    let admitted = format!(
        "{} vs {}",
        thousands(total.bucket_allowed),
        thousands(total.log_allowed)
    );
    rows(
        out,
        &[
            ("admitted, bucket vs log (independent)", admitted, ""),
            (
                "  bucket admits, log denies",
                share(total.bucket_only, n),
                "",
            ),
            (
                "  log admits, bucket denies",
                share(total.log_only_vs_bucket, n),
                "",
            ),
            (
                "bucket admissions over the limit in their period",
                share(total.bucket_over_window, n),
                "",
            ),
            (
                "bucket denials that a rolling window would admit",
                thousands(total.bucket_under_window),
                "",
            ),
            (
                "most bucket-admitted requests in one rolling period",
                times_limit(total.bucket_peak, limit),
                "",
            ),
        ],
    );
    out.push_str(
        "  Why: a bucket bounds the burst and the long-run rate, not the count in every rolling period. A full\n  \
         bucket spent at once refills during the next period, so up to burst + limit (here 2 x limit) fit in one\n  \
         period; it never denies what a rolling window would admit. They promise different things.\n\n",
    );
}

/// What the figures mean; printed under the tables.
const DEFINITIONS: &str = include_str!("definitions.txt");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_formatted_for_reading() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(400_000_000), "400,000,000");
        assert_eq!(percent(3, 100_000), "0.003 %");
        assert_eq!(percent(1, 0), "0.000 %");
        assert_eq!(secs(60_000_000), "60 s");
        assert_eq!(secs(1_250_000), "1.250 s");
    }
}
