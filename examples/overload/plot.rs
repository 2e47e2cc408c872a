//! `--plot FILE.svg`: the p99 latency of admitted requests over time for every design, and the adaptive limits.

use std::time::Duration;

use plotters::prelude::*;

use crate::load::{Outcome, Run, percentile};

/// Width of a latency bucket.
const BUCKET: Duration = Duration::from_millis(250);

/// Draws `runs` (design name, its run) over `total` seconds to `path`; `deadline` tops the latency axis and
/// `step_duration` marks the load steps (`loads`).
pub(crate) fn draw(
    path: &str,
    runs: &[(&'static str, Run)],
    loads: &[f64],
    step_duration: Duration,
    deadline: Duration,
) -> Result<(), Box<dyn std::error::Error>> {
    let total = (step_duration * loads.len() as u32).as_secs_f64();
    let root = SVGBackend::new(path, (1100, 800)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(440);
    let steps = loads
        .iter()
        .map(|l| format!("{l}×"))
        .collect::<Vec<_>>()
        .join(" → ");

    let deadline_ms = deadline.as_secs_f64() * 1e3;
    let mut latency = ChartBuilder::on(&top)
        .caption(
            format!("p99 latency of admitted requests (load {steps} capacity)"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..total, 0.0..deadline_ms * 1.05)?;
    latency
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("p99 ms (per 250 ms)")
        .draw()?;
    for (i, (name, run)) in runs.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let mut buckets: Vec<Vec<Duration>> =
            vec![Vec::new(); (total / BUCKET.as_secs_f64()).ceil() as usize + 1];
        for r in run
            .records
            .iter()
            .filter(|r| r.outcome != Outcome::Rejected)
        {
            let b = (r.sent.as_secs_f64() / BUCKET.as_secs_f64()) as usize;
            if let Some(bucket) = buckets.get_mut(b) {
                bucket.push(r.latency);
            }
        }
        let points = buckets.iter_mut().enumerate().filter_map(|(b, l)| {
            l.sort_unstable();
            (!l.is_empty()).then(|| (b as f64 * BUCKET.as_secs_f64(), percentile(l, 0.99)))
        });
        latency
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    latency
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;

    let adaptive: Vec<_> = runs
        .iter()
        .enumerate()
        .filter(|(_, (_, run))| !run.limits.is_empty())
        .collect();
    let max_limit = adaptive
        .iter()
        .flat_map(|(_, (_, run))| run.limits.iter().map(|(_, l)| *l))
        .max()
        .unwrap_or(1) as f64;
    let mut limits = ChartBuilder::on(&bottom)
        .caption("adaptive concurrency limit", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..total, 0.0..max_limit * 1.1)?;
    limits
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("requests in flight")
        .draw()?;
    for (i, (name, run)) in adaptive {
        let color = Palette99::pick(i).to_rgba();
        let points = run.limits.iter().map(|(t, l)| (t.as_secs_f64(), *l as f64));
        limits
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    limits
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
