//! `--plot FILE.svg`: the run as a line chart — admitted requests per second of every design, the configured limit
//! as a line, and under `--autoscale` the instance count on a second axis. `plotters`' SVG backend only: no system
//! libraries, no fonts to find (the SVG names a font family; the viewer draws the text).

use plotters::element::DashedPathElement;
use plotters::prelude::*;

/// One line: a design's admitted requests in each measured second.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub(crate) label: String,
    /// Its colour in [`PALETTE`]: the same design has the same colour in every chart.
    pub(crate) colour: usize,
    pub(crate) per_second: Vec<u64>,
}

/// What the chart shows.
#[derive(Debug, Clone)]
pub(crate) struct Chart {
    pub(crate) title: String,
    /// The limit each instance is configured with, per second: drawn as a horizontal line.
    pub(crate) limit: u64,
    pub(crate) series: Vec<Series>,
    /// Instances in each measured second (`--autoscale`), on the right-hand axis.
    pub(crate) instances: Option<Vec<u64>>,
}

const SIZE: (u32, u32) = (960, 540);

/// Line colours: the baseline grey, in-process blues, Redis reds, then Redis without its deny cache and Redis
/// with leases.
pub(crate) const PALETTE: [RGBColor; 9] = [
    RGBColor(140, 140, 140),
    RGBColor(31, 119, 180),
    RGBColor(23, 190, 207),
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
];
const INSTANCES: RGBColor = RGBColor(44, 160, 44);

/// The chart as SVG text.
pub(crate) fn render(chart: &Chart) -> Result<String, String> {
    let mut svg = String::new();
    draw(chart, &mut svg).map_err(|e| format!("drawing the chart: {e}"))?;
    Ok(svg)
}

/// Writes the chart to `path` as SVG.
pub(crate) fn write(path: &std::path::Path, chart: &Chart) -> Result<(), String> {
    let svg = render(chart)?;
    std::fs::write(path, svg).map_err(|e| format!("--plot {}: {e}", path.display()))
}

fn draw(chart: &Chart, out: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let seconds = chart
        .series
        .iter()
        .map(|s| s.per_second.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let highest = chart
        .series
        .iter()
        .flat_map(|s| s.per_second.iter().copied())
        .chain([chart.limit])
        .max()
        .unwrap_or(1);
    // Head room above the highest line for the legend.
    let y_max = (highest as f64 * 1.45).max(1.0);
    // Second i + 1 of the measured window, on whole-second ticks.
    let x_range = 0.5f64..seconds as f64 + 0.5;
    let x = |i: usize| i as f64 + 1.0;

    let root = SVGBackend::with_string(out, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(&chart.title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64);
    if chart.instances.is_some() {
        builder.right_y_label_area_size(56);
    }
    let instances_max = chart
        .instances
        .as_ref()
        .and_then(|i| i.iter().copied().max())
        .unwrap_or(1);
    let mut ctx = builder
        .build_cartesian_2d(x_range.clone(), 0f64..y_max)?
        .set_secondary_coord(x_range, 0f64..(instances_max as f64 + 1.0));
    ctx.configure_mesh()
        .x_desc("second of the measured window")
        .y_desc("admitted requests per second")
        .x_labels(seconds.min(20) + 1)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .light_line_style(RGBColor(238, 238, 238))
        .draw()?;

    // The limit first, under the lines: the Redis line lies on it.
    let limit = chart.limit as f64;
    ctx.draw_series(DashedLineSeries::new(
        [(0.5, limit), (seconds as f64 + 0.5, limit)],
        6,
        4,
        BLACK.stroke_width(1),
    ))?
    .label(format!("the limit: {} req/s", chart.limit))
    .legend(|(x, y)| DashedPathElement::new([(x, y), (x + 20, y)], 4, 3, BLACK.stroke_width(1)));
    for series in &chart.series {
        let color = PALETTE[series.colour % PALETTE.len()];
        ctx.draw_series(LineSeries::new(
            series
                .per_second
                .iter()
                .enumerate()
                .map(|(i, &n)| (x(i), n as f64)),
            color.stroke_width(2),
        ))?
        .label(&series.label)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }

    if let Some(instances) = &chart.instances {
        ctx.configure_secondary_axes()
            .y_desc("instances")
            .y_labels(instances_max as usize + 2)
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()?;
        ctx.draw_secondary_series(LineSeries::new(
            instances.iter().enumerate().map(|(i, &n)| (x(i), n as f64)),
            INSTANCES.stroke_width(2),
        ))?
        .label("instances (right axis)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], INSTANCES.stroke_width(2)));
    }

    ctx.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The polylines of an SVG, as their point counts and stroke colours.
    fn polylines(svg: &str) -> Vec<(usize, String)> {
        let doc = roxmltree::Document::parse(svg).expect("the SVG is well-formed XML");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        doc.descendants()
            .filter(|n| n.has_tag_name("polyline"))
            .map(|n| {
                let points = n
                    .attribute("points")
                    .unwrap_or("")
                    .split_whitespace()
                    .count();
                (points, n.attribute("stroke").unwrap_or("").to_owned())
            })
            .collect()
    }

    fn chart(designs: usize, seconds: usize, instances: bool) -> Chart {
        Chart {
            title: "test".into(),
            limit: 100,
            series: (0..designs)
                .map(|d| Series {
                    label: format!("design {d}"),
                    colour: d,
                    per_second: (0..seconds).map(|s| (100 * (d + 1) + s) as u64).collect(),
                })
                .collect(),
            instances: instances.then(|| (1..=seconds as u64).collect()),
        }
    }

    #[test]
    fn one_line_per_design_with_a_point_per_second() {
        let svg = render(&chart(5, 7, false)).unwrap();
        let lines = polylines(&svg);
        let series: Vec<_> = lines.iter().filter(|(points, _)| *points == 7).collect();
        assert_eq!(series.len(), 5, "{lines:?}");
        let colours: std::collections::BTreeSet<_> = series.iter().map(|(_, c)| c).collect();
        assert_eq!(colours.len(), 5, "each design its own colour: {series:?}");
        assert!(svg.contains("the limit: 100 req/s"), "the limit's legend");
        assert!(svg.contains("design 4"));
    }

    #[test]
    fn autoscale_adds_the_instance_count() {
        let svg = render(&chart(2, 6, true)).unwrap();
        let lines = polylines(&svg);
        assert_eq!(
            lines.iter().filter(|(points, _)| *points == 6).count(),
            3,
            "two designs and the instances: {lines:?}"
        );
        assert!(svg.contains("instances (right axis)"));
    }

    #[test]
    fn an_unwritable_path_is_an_error() {
        let err = write(
            std::path::Path::new("/no/such/dir/plot.svg"),
            &chart(1, 2, false),
        )
        .unwrap_err();
        assert!(err.starts_with("--plot /no/such/dir/plot.svg: "), "{err}");
    }
}
