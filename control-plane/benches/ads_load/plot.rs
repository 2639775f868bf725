//! The curve as a PNG: left, file write → every EDS ACK (p50 and p99) by fleet size; right,
//! istiod-lite memory per proxy. Goals are drawn as grey lines. Text needs a TrueType font; the
//! first of a few common system fonts is used (plotters' `ab_glyph` backend, no font library).

use std::path::Path;

use plotters::prelude::*;

/// One line of the plot: `(proxies, value)` points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub color: RGBColor,
    pub dashed: bool,
}

/// One panel: a title, the y axis, the series and a goal line.
pub struct Panel {
    pub title: String,
    pub y_desc: String,
    pub series: Vec<Series>,
    pub goal: Option<(String, f64)>,
    /// Where the legend goes (a corner the lines leave empty).
    pub legend: SeriesLabelPosition,
}

const FONTS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

fn register_font() -> Result<(), String> {
    let bytes = FONTS
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .ok_or_else(|| format!("no TrueType font found (looked for {FONTS:?})"))?;
    // plotters keeps fonts for the process lifetime.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| "the font file is not a valid TrueType font".to_string())
}

/// Writes `panels` side by side to `path` (PNG).
pub fn draw(path: &Path, title: &str, panels: &[Panel]) -> Result<(), String> {
    register_font()?;
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let width = 620 * panels.len().max(1) as u32;
    let root = BitMapBackend::new(path, (width, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(|x| e(&x))?;
    let areas = root.split_evenly((1, panels.len().max(1)));
    for (area, panel) in areas.iter().zip(panels) {
        let x_max = panel
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .fold(1.0, f64::max)
            * 1.05;
        let y_max = panel
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .chain(panel.goal.as_ref().map(|g| g.1))
            .fold(1.0, f64::max)
            * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc("simulated proxies")
            .y_desc(panel.y_desc.as_str())
            .x_label_formatter(&|x| format!("{}", *x as u64))
            .draw()
            .map_err(|x| e(&x))?;
        if let Some((name, y)) = &panel.goal {
            let grey = RGBColor(150, 150, 150);
            chart
                .draw_series(LineSeries::new(
                    [(0.0, *y), (x_max, *y)],
                    grey.stroke_width(2),
                ))
                .map_err(|x| e(&x))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], grey));
        }
        for s in &panel.series {
            let color = s.color;
            let style = if s.dashed {
                color.stroke_width(1)
            } else {
                color.stroke_width(3)
            };
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), style))
                .map_err(|x| e(&x))?
                .label(s.name.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
            chart
                .draw_series(s.points.iter().map(|p| Circle::new(*p, 4, color.filled())))
                .map_err(|x| e(&x))?;
        }
        chart
            .configure_series_labels()
            .position(panel.legend.clone())
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
