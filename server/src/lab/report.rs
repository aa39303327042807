//! Pictures of a lab run: an SVG timeline of slot phases and SVG latency
//! CDFs. Plain SVG text, viewable in any browser.

use std::fmt::Write;

use super::sim::PhaseSpan;

const WIDTH: f64 = 960.0;
const MARGIN: f64 = 60.0;
const PALETTE: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

fn phase_colour(phase: &str) -> &'static str {
    match phase {
        "prefilling" => "#4e79a7",
        "ready" => "#f28e2b",
        _ => "#59a14f",
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// One row per slot; a bar per phase span, coloured by phase.
pub fn timeline_svg(title: &str, slots: usize, spans: &[PhaseSpan]) -> String {
    let row = 18.0;
    let end = spans.iter().map(|span| span.end_ms).fold(1.0, f64::max);
    let scale = (WIDTH - 2.0 * MARGIN) / end;
    let height = 2.0 * MARGIN + row * slots as f64;
    let mut svg = header(height);
    let _ = writeln!(svg, r#"<text x="{MARGIN}" y="24" font-size="15">{}</text>"#, escape(title));
    for slot in 0..slots {
        let y = MARGIN + row * slot as f64;
        let _ = writeln!(svg, r#"<text x="8" y="{:.1}" font-size="11">slot {slot}</text>"#, y + row * 0.7);
    }
    for span in spans {
        let width = ((span.end_ms - span.start_ms) * scale).max(0.5);
        let _ = writeln!(
            svg,
            r#"<rect x="{:.2}" y="{:.1}" width="{width:.2}" height="{:.1}" fill="{}"><title>request {} {} {:.1}–{:.1} ms</title></rect>"#,
            MARGIN + span.start_ms * scale,
            MARGIN + row * span.slot as f64 + 1.0,
            row - 2.0,
            phase_colour(span.phase),
            span.request,
            span.phase,
            span.start_ms,
            span.end_ms
        );
    }
    let axis_y = MARGIN + row * slots as f64 + 16.0;
    let _ = writeln!(svg, r#"<text x="{MARGIN}" y="{axis_y:.1}" font-size="11">0 ms</text>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{axis_y:.1}" font-size="11" text-anchor="end">{end:.0} ms</text>"#,
        WIDTH - MARGIN
    );
    for (index, phase) in ["prefilling", "ready", "decoding"].iter().enumerate() {
        let x = MARGIN + 240.0 + 110.0 * index as f64;
        let _ = writeln!(
            svg,
            r#"<rect x="{x}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{}" y="{:.1}" font-size="11">{phase}</text>"#,
            axis_y - 10.0,
            phase_colour(phase),
            x + 16.0,
            axis_y
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Empirical CDFs of several named sample sets on shared axes.
pub fn cdf_svg(title: &str, unit: &str, series: &[(String, Vec<f64>)]) -> String {
    let height = 420.0;
    let max = series.iter().flat_map(|(_, samples)| samples.iter().copied()).fold(1e-9, f64::max);
    let (plot_w, plot_h) = (WIDTH - 2.0 * MARGIN, height - 2.0 * MARGIN);
    let mut svg = header(height);
    let _ = writeln!(svg, r#"<text x="{MARGIN}" y="24" font-size="15">{}</text>"#, escape(title));
    let _ = writeln!(
        svg,
        r##"<rect x="{MARGIN}" y="{MARGIN}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>"##
    );
    for (index, (name, samples)) in series.iter().enumerate() {
        let colour = PALETTE[index % PALETTE.len()];
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len().max(1) as f64;
        let points: Vec<String> = sorted
            .iter()
            .enumerate()
            .map(|(rank, value)| {
                format!("{:.2},{:.2}", MARGIN + value / max * plot_w, MARGIN + plot_h * (1.0 - (rank + 1) as f64 / n))
            })
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            points.join(" ")
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="12" fill="{colour}">{}</text>"#,
            MARGIN + 10.0,
            MARGIN + 18.0 + 16.0 * index as f64,
            escape(name)
        );
    }
    let axis_y = height - MARGIN + 16.0;
    let _ = writeln!(svg, r#"<text x="{MARGIN}" y="{axis_y}" font-size="11">0</text>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{axis_y}" font-size="11" text-anchor="end">{max:.1} {unit}</text>"#,
        WIDTH - MARGIN
    );
    let _ = writeln!(svg, r#"<text x="8" y="{:.1}" font-size="11">1.0</text>"#, MARGIN + 4.0);
    svg.push_str("</svg>\n");
    svg
}

fn header(height: f64) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pictures_are_well_formed_svg() {
        let spans = vec![
            PhaseSpan { slot: 0, request: 0, phase: "prefilling", start_ms: 0.0, end_ms: 10.0 },
            PhaseSpan { slot: 1, request: 1, phase: "decoding", start_ms: 10.0, end_ms: 30.0 },
        ];
        let timeline = timeline_svg("a <b> run", 2, &spans);
        assert!(timeline.starts_with("<svg") && timeline.ends_with("</svg>\n"));
        assert_eq!(timeline.matches("<title>request").count(), 2);
        assert!(timeline.contains("a &lt;b&gt; run"));
        let cdf = cdf_svg("TTFT", "ms", &[("continuous".into(), vec![3.0, 1.0, 2.0]), ("cohort".into(), vec![])]);
        assert_eq!(cdf.matches("<polyline").count(), 2);
        assert!(cdf.contains("3.0 ms"));
    }
}
