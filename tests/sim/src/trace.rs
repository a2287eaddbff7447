//! What a run leaves behind: a hash of everything that happened (the determinism
//! self-check compares two runs of one seed by it), the human-readable trace kept for
//! failure reports, and the swimlane timeline drawn as SVG.

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

    /// The run as `lockstep-timeline` draws it (the same picture as `lockstep demo
    /// --timeline`): each host's phase and version, the axis compressed where nothing
    /// changes, the lanes sampled for a large fleet (the controllers always shown), faults
    /// and client retries as ticks.
    pub fn picture(&self, end_ms: u64) -> lockstep_timeline::Picture {
        use lockstep_timeline::{Lane, Mark, MarkKind, Picture, Span};
        let mut lanes: Vec<Lane> = self
            .lanes
            .iter()
            .map(|lane| Lane {
                name: lane.name.clone(),
                pinned: lane.name.starts_with("controller-"),
                spans: lane
                    .spans
                    .iter()
                    .map(|&(from_ms, phase, version)| Span {
                        from_ms,
                        phase,
                        version: Some(version.to_string()),
                    })
                    .collect(),
            })
            .collect();
        let hosts = lanes.len();
        let clients = self
            .retries
            .iter()
            .map(|&(_, client)| client + 1)
            .max()
            .unwrap_or(0);
        lanes.extend((0..clients).map(|client| Lane {
            name: format!("client-{client}"),
            pinned: true,
            spans: Vec::new(),
        }));
        let faults = self.faults.iter().map(|(at_ms, host, what)| Mark {
            at_ms: *at_ms,
            lane: *host,
            kind: MarkKind::Fault,
            text: what.clone(),
        });
        let retries = self.retries.iter().map(|&(at_ms, client)| Mark {
            at_ms,
            lane: Some(hosts + client),
            kind: MarkKind::Retry,
            text: "retry".to_owned(),
        });
        Picture {
            title: "lockstep-sim timeline".to_owned(),
            lanes,
            marks: faults.chain(retries).collect(),
            end_ms,
        }
    }

    /// The swimlane as a standalone SVG document ([`Timeline::picture`], default options).
    pub fn to_svg(&self, end_ms: u64) -> String {
        lockstep_timeline::render(
            &self.picture(end_ms),
            &lockstep_timeline::Options::default(),
        )
    }
}
