//! What a run leaves behind: a hash of everything that happened (the determinism
//! self-check compares two runs of one seed by it), the human-readable trace kept for
//! failure reports, and the swimlane timeline drawn as SVG.

use std::fmt::Write as _;

use lockstep_core::lifecycle::{Input, Request, RequestId, request_name};
use lockstep_core::{Phase, Version};

/// FNV-1a, 64 bits: small, stable, good enough to tell two traces apart.
#[derive(Clone, Copy, Debug)]
struct Fnv(u64);

impl Fnv {
    const START: Fnv = Fnv(0xCBF2_9CE4_8422_2325);

    fn bytes(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 ^= u64::from(byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01B3);
        }
    }

    fn number(&mut self, value: u64) {
        self.bytes(&value.to_le_bytes());
    }
}

/// The trace of one run.
#[derive(Debug)]
pub struct Trace {
    hash: Fnv,
    lines: Option<Vec<String>>,
}

impl Trace {
    pub fn new(record: bool) -> Trace {
        Trace {
            hash: Fnv::START,
            lines: record.then(Vec::new),
        }
    }

    pub fn hash(&self) -> u64 {
        self.hash.0
    }

    pub fn into_lines(self) -> Option<Vec<String>> {
        self.lines
    }

    /// An event taken from the queue.
    pub fn event<E: std::fmt::Debug>(&mut self, now: u64, event: &E) {
        self.hash.number(now);
        if let Some(lines) = &mut self.lines {
            let mut text = format!("{event:?}");
            text.truncate(300);
            lines.push(format!("{} {text}", crate::format_ms(now)));
        }
    }

    /// An input fed to a process. Hashed by kind: the core's answer (its requests) is
    /// hashed in full, so a difference shows up there.
    pub fn input(&mut self, now: u64, host: usize, input: &Input) {
        self.hash.number(host as u64);
        self.hash.bytes(format!("{:?}", input.kind()).as_bytes());
        if let Some(lines) = &mut self.lines {
            let mut text = format!("{input:?}");
            text.truncate(300);
            lines.push(format!("{}   host {host} <- {text}", crate::format_ms(now)));
        }
    }

    /// A request a process made.
    pub fn request(&mut self, now: u64, host: usize, id: RequestId, request: &Request) {
        self.hash.number(host as u64);
        self.hash.number(id.0);
        self.hash.bytes(request_name(request).as_bytes());
        if let Some(lines) = &mut self.lines {
            let mut text = format!("{request:?}");
            text.truncate(300);
            lines.push(format!(
                "{}   host {host} -> {id} {text}",
                crate::format_ms(now)
            ));
        }
    }

    /// Anything else worth reading in a failure report (hashed too).
    pub fn note(&mut self, now: u64, text: &str) {
        self.hash.bytes(text.as_bytes());
        if let Some(lines) = &mut self.lines {
            lines.push(format!("{}   {text}", crate::format_ms(now)));
        }
    }
}

#[derive(Clone, Debug)]
struct Lane {
    name: String,
    /// (from, phase or down, version)
    spans: Vec<(u64, Option<Phase>, Version)>,
}

/// The swimlane: each party's phase over virtual time, faults and client retries marked.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    lanes: Vec<Lane>,
    faults: Vec<(u64, Option<usize>, String)>,
    retries: Vec<(u64, usize)>,
}

const LANE_HEIGHT: u64 = 18;
const LEFT: u64 = 130;
const WIDTH: u64 = 1200;

fn color(phase: Option<Phase>) -> &'static str {
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

impl Timeline {
    pub fn phase(
        &mut self,
        now: u64,
        host: usize,
        name: &str,
        phase: Option<Phase>,
        version: Version,
    ) {
        while self.lanes.len() <= host {
            self.lanes.push(Lane {
                name: String::new(),
                spans: Vec::new(),
            });
        }
        let lane = &mut self.lanes[host];
        lane.name = name.to_owned();
        lane.spans.push((now, phase, version));
    }

    pub fn fault(&mut self, now: u64, host: Option<usize>, what: &str) {
        self.faults.push((now, host, what.to_owned()));
    }

    pub fn retry(&mut self, now: u64, client: usize) {
        self.retries.push((now, client));
    }

    /// The swimlane as a standalone SVG document.
    pub fn to_svg(&self, end_ms: u64) -> String {
        let end_ms = end_ms.max(1);
        let x = |at: u64| LEFT + at.min(end_ms) * WIDTH / end_ms;
        let client_lanes = self
            .retries
            .iter()
            .map(|&(_, client)| client + 1)
            .max()
            .unwrap_or(0) as u64;
        let lanes = self.lanes.len() as u64;
        let height = (lanes + client_lanes + 4) * LANE_HEIGHT + 60;
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="monospace" font-size="11">"#,
            LEFT + WIDTH + 20
        );
        let _ = writeln!(
            svg,
            r#"<text x="4" y="14">lockstep-sim timeline: 0 .. {} (phases: blue boot, orange steps, lilac upgrading, green ready, red held, grey down; red ticks faults, black ticks client retries)</text>"#,
            crate::format_ms(end_ms)
        );
        for (index, lane) in self.lanes.iter().enumerate() {
            let y = 30 + index as u64 * LANE_HEIGHT;
            let _ = writeln!(svg, r#"<text x="4" y="{}">{}</text>"#, y + 12, lane.name);
            for (span, &(from, phase, version)) in lane.spans.iter().enumerate() {
                let until = lane.spans.get(span + 1).map_or(end_ms, |next| next.0);
                let width = x(until).saturating_sub(x(from)).max(1);
                let label = phase.map_or("down".to_owned(), |phase| phase.as_str().to_owned());
                let _ = writeln!(
                    svg,
                    r#"<rect x="{}" y="{y}" width="{width}" height="{}" fill="{}"><title>{} {label} on {version} from {}</title></rect>"#,
                    x(from),
                    LANE_HEIGHT - 3,
                    color(phase),
                    lane.name,
                    crate::format_ms(from)
                );
            }
        }
        for (at, host, what) in &self.faults {
            let (y0, y1) = match host {
                Some(host) => {
                    let y = 30 + *host as u64 * LANE_HEIGHT;
                    (y, y + LANE_HEIGHT - 3)
                }
                None => (24, 30 + lanes * LANE_HEIGHT),
            };
            let _ = writeln!(
                svg,
                r#"<line x1="{0}" x2="{0}" y1="{y0}" y2="{y1}" stroke="red" stroke-width="2"><title>{what} at {1}</title></line>"#,
                x(*at),
                crate::format_ms(*at)
            );
        }
        let base = 40 + lanes * LANE_HEIGHT;
        for client in 0..client_lanes {
            let y = base + client * LANE_HEIGHT;
            let _ = writeln!(svg, r#"<text x="4" y="{}">client-{client}</text>"#, y + 12);
        }
        for &(at, client) in &self.retries {
            let y = base + client as u64 * LANE_HEIGHT;
            let _ = writeln!(
                svg,
                r#"<line x1="{0}" x2="{0}" y1="{y}" y2="{1}" stroke="black"><title>retry at {2}</title></line>"#,
                x(at),
                y + LANE_HEIGHT - 3,
                crate::format_ms(at)
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}
