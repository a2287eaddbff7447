//! # lockstep-timeline
//!
//! The swimlane picture of an upgrade: one lane per party (controllers, machine agents,
//! clients), each lane's phase as a coloured bar and the version it runs as a stripe
//! beneath it (labelled where there is room), faults and client retries as ticks. One
//! renderer for the simulator (`lockstep-sim --timeline`) and for a real run
//! (`lockstep demo --timeline`), so both draw the same picture.
//!
//! Two things make the picture readable where a linear axis is not:
//!
//! - **A compressed axis** ([`Axis`]): an upgrade is seconds of change inside minutes of
//!   Ready. Every stretch of time longer than [`Options::quiet_fraction`] of the run in
//!   which nothing changes (no span begins, no mark) is drawn [`BREAK_WIDTH`] pixels wide,
//!   with a break sign and its length; the rest of the width goes, linearly, to the
//!   moments where things change.
//! - **Sampled lanes** ([`sample`]): a fleet of 10,000 agents is drawn as at most
//!   [`Options::lanes_max`] lanes: every pinned lane (the controllers), then lanes that
//!   failed or went down, then evenly spaced others; the title says what is shown.
//!
//! Pure: text in, text out; no I/O, no clock.

use std::collections::BTreeMap;
use std::fmt::Write;

use lockstep_core::Phase;

/// The pixels a quiet stretch of time is drawn on.
pub const BREAK_WIDTH: u64 = 18;
/// The height of a lane, bar and version stripe.
pub const LANE_HEIGHT: u64 = 20;
/// The left margin, where lane names go.
pub const LEFT: u64 = 150;

/// What one party did over the run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lane {
    /// Its name (`machine-0`, `client-3`).
    pub name: String,
    /// Always drawn, however many lanes there are (the controllers).
    pub pinned: bool,
    /// Its spans, in time order: each lasts until the next begins (the last until the
    /// end of the run).
    pub spans: Vec<Span>,
}

/// From `from_ms` on, a party is in `phase` (`None`: down, not running) on `version`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    pub from_ms: u64,
    pub phase: Option<Phase>,
    /// The version it runs (`None`: not known).
    pub version: Option<String>,
}

/// What a tick marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkKind {
    /// An injected fault (red).
    Fault,
    /// A client's retry (black).
    Retry,
    /// Anything else worth a tick (blue).
    Event,
}

/// A tick at `at_ms` on lane `lane` (`None`: across every lane).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    pub at_ms: u64,
    pub lane: Option<usize>,
    pub kind: MarkKind,
    pub text: String,
}

/// A whole picture: its title, lanes, marks, and the run's end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Picture {
    pub title: String,
    pub lanes: Vec<Lane>,
    pub marks: Vec<Mark>,
    pub end_ms: u64,
}

/// How a picture is drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Options {
    /// The plot's width in pixels (the lane names are left of it).
    pub width: u64,
    /// The most lanes drawn; more are sampled ([`sample`]).
    pub lanes_max: usize,
    /// A stretch with no change longer than this fraction of the run is compressed.
    pub quiet_fraction: f64,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            width: 1200,
            lanes_max: 80,
            quiet_fraction: 0.04,
        }
    }
}

/// The time axis: piecewise linear, quiet stretches compressed to [`BREAK_WIDTH`].
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    /// `(from_ms, until_ms, x_from, x_until, quiet)`, covering `0..end` in order.
    pieces: Vec<(u64, u64, f64, f64, bool)>,
}

impl Axis {
    /// The axis of a run ending at `end_ms` whose changes happen at `changes` (any
    /// order, duplicates allowed), `width` pixels wide.
    pub fn new(changes: &[u64], end_ms: u64, width: u64, quiet_fraction: f64) -> Axis {
        let end_ms = end_ms.max(1);
        let mut moments: Vec<u64> = changes
            .iter()
            .copied()
            .filter(|at| *at < end_ms)
            .chain([0, end_ms])
            .collect();
        moments.sort_unstable();
        moments.dedup();
        let quiet_ms = ((end_ms as f64) * quiet_fraction).max(1.0) as u64;
        let gaps: Vec<(u64, u64, bool)> = moments
            .windows(2)
            .map(|pair| (pair[0], pair[1], pair[1] - pair[0] > quiet_ms))
            .collect();
        let quiet_count = gaps.iter().filter(|gap| gap.2).count() as u64;
        let busy_ms: u64 = gaps
            .iter()
            .filter(|gap| !gap.2)
            .map(|gap| gap.1 - gap.0)
            .sum();
        let break_width = if busy_ms == 0 {
            // Nothing but quiet: share the width among the breaks.
            width as f64 / quiet_count.max(1) as f64
        } else {
            BREAK_WIDTH.min(width / (quiet_count + 1).max(1)) as f64
        };
        let busy_width = (width as f64 - break_width * quiet_count as f64).max(0.0);
        let mut x = 0.0;
        let pieces = gaps
            .into_iter()
            .map(|(from, until, quiet)| {
                let span = if quiet {
                    break_width
                } else {
                    busy_width * (until - from) as f64 / busy_ms.max(1) as f64
                };
                let piece = (from, until, x, x + span, quiet);
                x += span;
                piece
            })
            .collect();
        Axis { pieces }
    }

    /// The x of `at_ms` (0 to the width; past the end is the end).
    pub fn x(&self, at_ms: u64) -> f64 {
        for &(from, until, x0, x1, _) in &self.pieces {
            if at_ms <= until {
                let fraction = (at_ms.saturating_sub(from)) as f64 / (until - from).max(1) as f64;
                return x0 + (x1 - x0) * fraction;
            }
        }
        self.pieces.last().map_or(0.0, |piece| piece.3)
    }

    /// The compressed stretches: `(from_ms, until_ms, x_from, x_until)`.
    pub fn breaks(&self) -> impl Iterator<Item = (u64, u64, f64, f64)> + '_ {
        self.pieces
            .iter()
            .filter(|piece| piece.4)
            .map(|&(from, until, x0, x1, _)| (from, until, x0, x1))
    }
}

/// Which lanes to draw, at most `max` (by index, in order): every pinned lane, then lanes
/// that failed or went down (up to half of what is left), then evenly spaced others. Also
/// says what was kept, for the title.
pub fn sample(lanes: &[Lane], max: usize) -> (Vec<usize>, String) {
    if lanes.len() <= max {
        return ((0..lanes.len()).collect(), format!("{} lanes", lanes.len()));
    }
    let troubled = |lane: &Lane| {
        lane.spans.iter().any(|span| {
            matches!(
                span.phase,
                None | Some(Phase::StepsFailed | Phase::UpgradeFailed)
            )
        })
    };
    let pinned: Vec<usize> = (0..lanes.len()).filter(|i| lanes[*i].pinned).collect();
    let budget = max.saturating_sub(pinned.len());
    let trouble: Vec<usize> = (0..lanes.len())
        .filter(|i| !lanes[*i].pinned && troubled(&lanes[*i]))
        .take(budget / 2)
        .collect();
    let rest: Vec<usize> = (0..lanes.len())
        .filter(|i| !lanes[*i].pinned && !trouble.contains(i))
        .collect();
    let room = budget - trouble.len();
    let every = rest.len().div_ceil(room.max(1)).max(1);
    let others: Vec<usize> = rest.iter().copied().step_by(every).take(room).collect();
    let mut kept: Vec<usize> = pinned
        .iter()
        .chain(&trouble)
        .chain(&others)
        .copied()
        .collect();
    kept.sort_unstable();
    let said = format!(
        "{} of {} lanes: {} pinned, {} that failed or went down, every {}th other",
        kept.len(),
        lanes.len(),
        pinned.len(),
        trouble.len(),
        every
    );
    (kept, said)
}

/// A phase's colour.
pub fn color(phase: Option<Phase>) -> &'static str {
    match phase {
        None => "#dddddd",
        Some(Phase::Bootstrapping) => "#9ecae1",
        Some(Phase::RunningSteps) => "#fdae6b",
        Some(Phase::CheckingAgentVersion) => "#c6dbef",
        Some(Phase::Upgrading) => "#bcbddc",
        Some(Phase::Ready) => "#a1d99b",
        Some(Phase::StepsFailed) => "#fb6a4a",
        Some(Phase::UpgradeFailed) => "#e377c2",
        Some(Phase::Restarting) => "#fdd0a2",
    }
}

/// The stripe colours of versions, in the order they first appear.
const VERSION_COLORS: [&str; 6] = [
    "#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363", "#8c6d31",
];

/// `1h02m03.004s`-style time.
pub fn format_ms(ms: u64) -> String {
    let (hours, minutes, seconds, millis) =
        (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    if hours > 0 {
        format!("{hours}h{minutes:02}m{seconds:02}.{millis:03}s")
    } else if minutes > 0 {
        format!("{minutes}m{seconds:02}.{millis:03}s")
    } else {
        format!("{seconds}.{millis:03}s")
    }
}

/// Text for SVG: `&`, `<`, `>` and `"` escaped.
fn escaped(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The picture as a standalone SVG document.
pub fn render(picture: &Picture, options: &Options) -> String {
    let end_ms = picture.end_ms.max(1);
    let (kept, said) = sample(&picture.lanes, options.lanes_max);
    let row_of: BTreeMap<usize, usize> = kept
        .iter()
        .enumerate()
        .map(|(row, lane)| (*lane, row))
        .collect();
    let mut changes: Vec<u64> = kept
        .iter()
        .flat_map(|lane| picture.lanes[*lane].spans.iter().map(|span| span.from_ms))
        .collect();
    changes.extend(
        picture
            .marks
            .iter()
            .filter(|mark| mark.lane.is_none_or(|lane| row_of.contains_key(&lane)))
            .map(|mark| mark.at_ms),
    );
    let axis = Axis::new(&changes, end_ms, options.width, options.quiet_fraction);
    let x = |at: u64| LEFT as f64 + axis.x(at.min(end_ms));
    let top = 56u64;
    let rows = kept.len() as u64;
    let mut versions: Vec<&str> = Vec::new();
    for lane in &kept {
        for span in &picture.lanes[*lane].spans {
            if let Some(version) = span.version.as_deref()
                && !versions.contains(&version)
            {
                versions.push(version);
            }
        }
    }
    let version_color = |version: &str| {
        versions
            .iter()
            .position(|known| *known == version)
            .map_or("#ffffff", |index| {
                VERSION_COLORS[index % VERSION_COLORS.len()]
            })
    };
    let height = top + rows * LANE_HEIGHT + 40;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="monospace" font-size="11">"#,
        LEFT + options.width + 20
    );
    let _ = writeln!(
        svg,
        r#"<text x="4" y="14">{} (0 .. {}; {said})</text>"#,
        escaped(&picture.title),
        format_ms(end_ms)
    );
    let _ = writeln!(
        svg,
        r#"<text x="4" y="30">phase: blue booting, orange steps, lilac upgrading, green ready, red held, pink fell back, grey down; stripe: version; red ticks faults, black retries; ≈ a quiet stretch, compressed</text>"#
    );
    for (index, version) in versions.iter().enumerate() {
        let x0 = LEFT + index as u64 * 110;
        let _ = writeln!(
            svg,
            r#"<rect x="{x0}" y="38" width="12" height="8" fill="{}"/><text x="{}" y="46">{}</text>"#,
            VERSION_COLORS[index % VERSION_COLORS.len()],
            x0 + 16,
            escaped(version)
        );
    }
    for (row, lane_index) in kept.iter().enumerate() {
        let lane = &picture.lanes[*lane_index];
        let y = top + row as u64 * LANE_HEIGHT;
        let _ = writeln!(
            svg,
            r#"<text x="4" y="{}">{}</text>"#,
            y + 12,
            escaped(&lane.name)
        );
        for (index, span) in lane.spans.iter().enumerate() {
            let until = lane
                .spans
                .get(index + 1)
                .map_or(end_ms, |next| next.from_ms);
            let (x0, x1) = (x(span.from_ms), x(until));
            let width = (x1 - x0).max(1.0);
            let phase = span.phase.map_or("down", Phase::as_str);
            let version = span.version.as_deref().unwrap_or("?");
            let _ = writeln!(
                svg,
                r#"<rect x="{x0:.1}" y="{y}" width="{width:.1}" height="{}" fill="{}"><title>{} {phase} on {} from {}</title></rect>"#,
                LANE_HEIGHT - 7,
                color(span.phase),
                escaped(&lane.name),
                escaped(version),
                format_ms(span.from_ms)
            );
            if let Some(version) = span.version.as_deref() {
                let _ = writeln!(
                    svg,
                    r#"<rect x="{x0:.1}" y="{}" width="{width:.1}" height="3" fill="{}"/>"#,
                    y + LANE_HEIGHT - 6,
                    version_color(version)
                );
                // The version's name where the bar has room for it and it changed.
                let changed =
                    index == 0 || lane.spans[index - 1].version.as_deref() != Some(version);
                if changed && width >= 7.0 * version.len() as f64 + 4.0 {
                    let _ = writeln!(
                        svg,
                        r#"<text x="{:.1}" y="{}" font-size="9">{}</text>"#,
                        x0 + 2.0,
                        y + 10,
                        escaped(version)
                    );
                }
            }
        }
    }
    let bottom = top + rows * LANE_HEIGHT;
    for (from, until, x0, x1) in axis.breaks() {
        let (x0, x1) = (LEFT as f64 + x0, LEFT as f64 + x1);
        let _ = writeln!(
            svg,
            r##"<rect x="{x0:.1}" y="{}" width="{:.1}" height="{}" fill="#ffffff" fill-opacity="0.6"/><text x="{:.1}" y="{}" text-anchor="middle">≈</text><text x="{:.1}" y="{}" font-size="9" text-anchor="middle"><title>{} to {}: nothing changed</title>{}</text>"##,
            top - 2,
            x1 - x0,
            bottom - top + 2,
            (x0 + x1) / 2.0,
            top - 4,
            (x0 + x1) / 2.0,
            bottom + 12,
            format_ms(from),
            format_ms(until),
            format_ms(until - from)
        );
    }
    for mark in &picture.marks {
        let (y0, y1) = match mark.lane {
            Some(lane) => match row_of.get(&lane) {
                Some(row) => {
                    let y = top + *row as u64 * LANE_HEIGHT;
                    (y, y + LANE_HEIGHT - 4)
                }
                None => continue,
            },
            None => (top - 4, bottom),
        };
        let stroke = match mark.kind {
            MarkKind::Fault => "red",
            MarkKind::Retry => "black",
            MarkKind::Event => "#08519c",
        };
        let _ = writeln!(
            svg,
            r#"<line x1="{0:.1}" x2="{0:.1}" y1="{y0}" y2="{y1}" stroke="{stroke}" stroke-width="1.5"><title>{1} at {2}</title></line>"#,
            x(mark.at_ms),
            escaped(&mark.text),
            format_ms(mark.at_ms)
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="{}">0</text><text x="{}" y="{}" text-anchor="end">{}</text>"#,
        bottom + 28,
        LEFT + options.width,
        bottom + 28,
        format_ms(end_ms)
    );
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(from_ms: u64, phase: Option<Phase>, version: &str) -> Span {
        Span {
            from_ms,
            phase,
            version: Some(version.to_owned()),
        }
    }

    #[test]
    fn a_quiet_stretch_is_compressed_and_the_changes_get_the_width() {
        // Changes in the first second and the last, ten minutes of nothing between.
        let axis = Axis::new(&[0, 500, 1000, 600_000, 600_500], 601_000, 1000, 0.04);
        assert_eq!(axis.x(0), 0.0);
        assert!((axis.x(601_000) - 1000.0).abs() < 1e-6);
        let breaks: Vec<_> = axis.breaks().collect();
        assert_eq!(breaks.len(), 1, "{breaks:?}");
        assert_eq!((breaks[0].0, breaks[0].1), (1000, 600_000));
        assert!((breaks[0].3 - breaks[0].2 - BREAK_WIDTH as f64).abs() < 1e-6);
        // The first second of change is drawn wide, not as a sliver of 1/600.
        assert!(axis.x(1000) > 400.0, "{}", axis.x(1000));
        // Monotonic.
        let mut last = -1.0;
        for at in (0..=601_000).step_by(997) {
            let x = axis.x(at);
            assert!(x >= last, "{at}: {x} < {last}");
            last = x;
        }
    }

    #[test]
    fn a_run_with_changes_everywhere_is_linear() {
        let changes: Vec<u64> = (0..100).map(|i| i * 10).collect();
        let axis = Axis::new(&changes, 1000, 1000, 0.04);
        assert_eq!(axis.breaks().count(), 0);
        assert!((axis.x(500) - 500.0).abs() < 1e-6);
    }

    fn fleet(agents: usize) -> Vec<Lane> {
        let mut lanes = vec![Lane {
            name: "machine-0".into(),
            pinned: true,
            spans: vec![span(0, Some(Phase::Ready), "2.9.44")],
        }];
        for i in 1..=agents {
            let mut spans = vec![span(0, Some(Phase::Ready), "2.9.44")];
            if i == 777 {
                spans.push(span(10, Some(Phase::StepsFailed), "2.9.45"));
            }
            lanes.push(Lane {
                name: format!("machine-{i}"),
                pinned: false,
                spans,
            });
        }
        lanes
    }

    #[test]
    fn a_large_fleet_is_sampled_keeping_pinned_and_troubled_lanes() {
        let lanes = fleet(10_000);
        let (kept, said) = sample(&lanes, 80);
        assert!(kept.len() <= 80, "{}", kept.len());
        assert!(kept.contains(&0) && kept.contains(&777), "{kept:?}");
        assert!(
            said.starts_with(&format!("{} of 10001 lanes", kept.len())),
            "{said}"
        );
        let (all, _) = sample(&fleet(10), 80);
        assert_eq!(all.len(), 11);
    }

    #[test]
    fn the_picture_shows_versions_breaks_and_is_deterministic() {
        let picture = Picture {
            title: "test <run>".into(),
            lanes: vec![Lane {
                name: "machine-0".into(),
                pinned: true,
                spans: vec![
                    span(0, Some(Phase::Ready), "2.9.44"),
                    span(600_000, Some(Phase::Upgrading), "2.9.44"),
                    span(602_000, Some(Phase::Ready), "2.9.45"),
                ],
            }],
            marks: vec![Mark {
                at_ms: 601_000,
                lane: Some(0),
                kind: MarkKind::Fault,
                text: "crash".into(),
            }],
            end_ms: 610_000,
        };
        let svg = render(&picture, &Options::default());
        assert_eq!(svg, render(&picture, &Options::default()));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("test &lt;run&gt;"), "escaped title");
        assert!(svg.contains(">2.9.45</text>"), "the new version labelled");
        assert!(svg.contains("≈"), "the quiet ten minutes compressed");
        assert!(svg.contains("crash at 10m01.000s"));
    }
}
