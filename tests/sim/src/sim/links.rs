//! The link model of a fleet upgrade (issue 21): agent-binary downloads take time.
//!
//! - Each controller has an egress (bytes/s) shared fairly among the agent downloads it
//!   serves at the moment: processor sharing with each download capped by its agent's link
//!   (max-min fair: a download its agent's link holds below the equal share keeps its cap,
//!   the others share the rest equally). When a download starts or ends, every other's rate
//!   and so its remaining time is computed again.
//! - Each agent has its own link speed, drawn once from the run's generator (some agents
//!   are slow), and each download varies around it (jitter).
//! - A controller serves a binary from its cache: its own staging (`StageBinary` to the
//!   stream, at the upstream bandwidth) puts it there, and a download admitted before that
//!   waits for one upstream fetch, shared by every download that waits for it (as the
//!   transport's tools endpoint does).
//! - Admission is the core's: `upgrader::admit_agent_download` under the model's
//!   `max-agent-downloads` (`upgrader::agent_downloads_max`); past it a request waits in
//!   the controller's queue, first come first served, and takes the next slot freed, as
//!   the tools endpoint's queue does (`lockstep-transport`'s `tools_endpoint.rs`); after
//!   `upgrader::DOWNLOAD_QUEUE_WAIT` in it, or with the queue full, the controller answers
//!   "busy", asking for the time its queue takes to drain (`upgrader::busy_retry_after`,
//!   from its running estimate of a download's time), and the agent waits that, with
//!   jitter (`upgrader::busy_download_backoff`; the machine agent's driver does the same,
//!   for as long as [`BUSY_WAIT_MAX_MS`]). An admitted agent's download goes before the
//!   fetches ahead of admission that wait (the tools endpoint tells them by the binary: not
//!   the version the agent is told to run).
//!
//! - A machine agent that knows no rate for its link (a fleet's first rollout) probes it
//!   soon after it starts: [`upgrader::LINK_PROBE_BYTES`] from a controller, outside the
//!   download slots, sharing the egress like a download; the rate measured is the one its
//!   status reports until a download measures another.
//!
//! Latency per message is the network's (`network.rs`). A download in progress is a
//! stream: its bytes are not lost one message at a time, but the connection dies with
//! either end (a crash), and the agent then tries again.

use std::collections::{BTreeSet, VecDeque};

use lockstep_core::Version;
use lockstep_core::lifecycle::{Input, RequestId, StagePlan};
use lockstep_core::upgrader::{self, DownloadAdmission};

use super::network::{Message, Party};
use super::{Event, Sim};
use crate::rng::Rng;
use crate::scenario::Fleet;

/// How long a machine agent waits through "busy" answers before it reports its download
/// failed (lockstep-agent's `BUSY_WAIT_MAX`, `daemon/machine_agent.rs`).
pub const BUSY_WAIT_MAX_MS: u64 = 600_000;

/// One admitted download (it holds one of its controller's slots).
#[derive(Clone, Debug)]
struct Download {
    host: usize,
    incarnation: u64,
    id: RequestId,
    attempt: u32,
    binary: Version,
    /// The agent's link for this download, bytes/s.
    cap: u64,
    /// The binary's size.
    size_bytes: u64,
    /// Bytes still to send, times 1000 (so that a rate in bytes/s times milliseconds is
    /// exact).
    remaining: u128,
    /// Bytes/s now.
    rate: u64,
    admitted_at: u64,
    /// When its first byte went out: at admission, or once the upstream fetch it waited
    /// for was done.
    first_byte_at: u64,
    /// Waiting for the controller's upstream fetch of `binary`.
    waiting: bool,
    /// A link probe ([`upgrader::LINK_PROBE_BYTES`]): outside the download slots, and what
    /// it measures is the agent's rate from then on.
    probe: bool,
}

/// One controller's side.
#[derive(Clone, Debug, Default)]
struct ControllerLink {
    egress: u64,
    downloads: Vec<Download>,
    /// When `remaining` was last brought up to date.
    updated_at: u64,
    /// Bumped at every reshare: a completion event of an older generation is void.
    generation: u64,
    cached: BTreeSet<Version>,
    fetching: BTreeSet<Version>,
    /// Requests waiting for a slot, in the order they are served.
    queue: VecDeque<Queued>,
    /// How long a download holds its slot, as the controller estimates it from those that
    /// ended (`upgrader::transfer_estimate`), for the wait a busy answer asks for.
    transfer: Option<lockstep_core::Millis>,
}

impl ControllerLink {
    /// Download slots in use: every download but the link probes.
    fn slots_taken(&self) -> u32 {
        self.downloads.iter().filter(|d| !d.probe).count() as u32
    }
}

/// A request waiting in a controller's queue for a download slot.
#[derive(Clone, Debug)]
pub(super) struct Queued {
    host: usize,
    incarnation: u64,
    id: RequestId,
    attempt: u32,
    binary: Version,
    size_bytes: u64,
    /// A fetch ahead of the agent's admission: admitted agents' downloads go before it.
    ahead: bool,
}

/// What the fleet's downloads did, for its report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Each completed download: admission to last byte, ms.
    pub transfers_ms: Vec<u64>,
    /// Each agent's staging through a controller: its `StageBinary` asked to the binary
    /// staged, busy answers and retries included, ms.
    pub downloads_ms: Vec<u64>,
    /// "Busy" answers the controllers gave (the queue full, or no slot within its wait).
    pub busy: u64,
    /// Requests that waited in a controller's queue.
    pub queued: u64,
    /// The most requests one controller's queue held at once.
    pub most_waiting: u32,
    /// Downloads an agent gave up after [`BUSY_WAIT_MAX_MS`] of busy answers.
    pub busy_gave_up: u64,
    /// Downloads cut by a crash of either end.
    pub cut: u64,
    /// Link probes the controllers served to the end (agents that knew no rate).
    pub probes: u64,
    /// Link probes answered busy (past `LINK_PROBES_AT_ONCE`).
    pub probes_busy: u64,
    /// Upstream fetches by controllers (their own staging included).
    pub upstream_fetches: u64,
    /// The most downloads one controller served at once.
    pub most_at_once: u32,
    /// The last downloads to end: `(ended at, admitted at, the agent's link in bytes/s)`,
    /// the latest last, at most [`LAST_DOWNLOADS_KEPT`].
    pub last_downloads: Vec<(u64, u64, u64)>,
    /// Bytes the controllers sent to agents in each second of virtual time (index: the
    /// second), times 1000 (rates in bytes/s times milliseconds), for where the egress
    /// stood idle.
    pub sent_by_second: Vec<u64>,
}

/// How many of the last downloads [`LinkStats::last_downloads`] keeps.
pub const LAST_DOWNLOADS_KEPT: usize = 5;

/// Adds `rate` bytes/s over `[from, to)` ms to the per-second buckets (bytes × 1000).
fn record_sent(buckets: &mut Vec<u64>, from: u64, to: u64, rate: u64) {
    let mut at = from;
    while rate > 0 && at < to {
        let second = (at / 1000) as usize;
        let end = ((at / 1000 + 1) * 1000).min(to);
        if buckets.len() <= second {
            buckets.resize(second + 1, 0);
        }
        buckets[second] += rate * (end - at);
        at = end;
    }
}

/// Every link of a fleet run.
#[derive(Clone, Debug)]
pub(super) struct Links {
    upstream: u64,
    jitter_per_mille: u64,
    /// The model's `max-agent-downloads`, as the core reads it.
    pub(super) downloads_max: u32,
    controllers: Vec<ControllerLink>,
    /// Each host's own link, bytes/s (controllers: unused).
    agent_link: Vec<u64>,
    /// The rate of each agent's last download, bytes/s, first byte to last, as its status
    /// reports it (`data.download-rate`); `None` when it never downloaded one.
    pub(super) measured: Vec<Option<u64>>,
    /// The controller each host is downloading from now.
    receiving: Vec<Option<usize>>,
    /// The controller in whose queue each host's request waits now.
    queued: Vec<Option<usize>>,
    pub(super) stats: LinkStats,
}

impl Links {
    pub(super) fn new(fleet: &Fleet, controllers: usize, hosts: usize, rng: &mut Rng) -> Links {
        let agent_link: Vec<u64> = (0..hosts)
            .map(|_| {
                let usual = fleet.agent_bytes_per_second;
                if rng.chance(fleet.slow_agents_per_million) {
                    // A slow link: 1–10% of the usual.
                    usual * rng.range(10, 100) / 1000
                } else {
                    usual * rng.range(800, 1000) / 1000
                }
                .max(1)
            })
            .collect();
        // An earlier upgrade's download, alone on the agent's link (with its jitter).
        let measured = agent_link
            .iter()
            .enumerate()
            .map(|(host, link)| {
                (fleet.rates_known && host >= controllers).then(|| {
                    let spread = rng.range(
                        1000 - fleet.jitter_per_mille.min(900),
                        1000 + fleet.jitter_per_mille.min(900),
                    );
                    (link * spread / 1000).max(1)
                })
            })
            .collect();
        Links {
            measured,
            upstream: fleet.upstream_bytes_per_second.max(1),
            jitter_per_mille: fleet.jitter_per_mille.min(900),
            downloads_max: super::agent_downloads_max(fleet),
            controllers: (0..controllers)
                .map(|_| ControllerLink {
                    egress: fleet.egress_bytes_per_second.max(1),
                    ..ControllerLink::default()
                })
                .collect(),
            agent_link,
            receiving: vec![None; hosts],
            queued: vec![None; hosts],
            stats: LinkStats::default(),
        }
    }

    /// Milliseconds an upstream fetch of `bytes` takes.
    pub(super) fn upstream_ms(&self, bytes: u64) -> u64 {
        (u128::from(bytes) * 1000).div_ceil(u128::from(self.upstream)) as u64
    }

    /// Whether `host` is receiving the download of attempt `attempt` of request `id`.
    pub(super) fn receiving(&self, host: usize, id: RequestId, attempt: u32) -> bool {
        self.receiving[host].is_some_and(|controller| {
            self.controllers[controller]
                .downloads
                .iter()
                .any(|d| d.host == host && d.id == id && d.attempt == attempt)
        })
    }

    /// Whether attempt `attempt` of `host`'s request `id` waits in a controller's queue.
    pub(super) fn waiting(&self, host: usize, id: RequestId, attempt: u32) -> bool {
        self.queued[host].is_some_and(|controller| {
            self.controllers[controller]
                .queue
                .iter()
                .any(|q| q.host == host && q.id == id && q.attempt == attempt)
        })
    }

    /// Takes `host`'s request out of the queue it waits in, if any.
    fn dequeue_host(&mut self, host: usize) {
        if let Some(controller) = self.queued[host].take() {
            self.controllers[controller]
                .queue
                .retain(|queued| queued.host != host);
        }
    }

    /// Brings every download of `controller` up to `now`.
    fn settle(&mut self, controller: usize, now: u64) {
        let link = &mut self.controllers[controller];
        let elapsed = u128::from(now.saturating_sub(link.updated_at));
        let mut rate = 0;
        for download in link.downloads.iter_mut().filter(|d| !d.waiting) {
            let sent = u128::from(download.rate) * elapsed;
            download.remaining = download.remaining.saturating_sub(sent);
            rate += download.rate;
        }
        let from = link.updated_at;
        link.updated_at = now;
        record_sent(&mut self.stats.sent_by_second, from, now, rate);
    }

    /// Shares `controller`'s egress among its downloads (max-min fair) and says when the
    /// next one ends, with the generation that event carries.
    fn reshare(&mut self, controller: usize, now: u64) -> Option<(u64, u64)> {
        let link = &mut self.controllers[controller];
        link.generation += 1;
        let mut active: Vec<&mut Download> =
            link.downloads.iter_mut().filter(|d| !d.waiting).collect();
        active.sort_by_key(|d| (d.cap, d.host));
        let mut left = link.egress;
        let mut sharing = active.len() as u64;
        for download in &mut active {
            let share = left / sharing.max(1);
            download.rate = download.cap.min(share).max(1);
            left = left.saturating_sub(download.rate);
            sharing -= 1;
        }
        let next = active
            .iter()
            .map(|d| now + d.remaining.div_ceil(u128::from(d.rate)) as u64)
            .min()?;
        Some((next, link.generation))
    }

    fn remove_host(&mut self, host: usize) -> Option<usize> {
        let controller = self.receiving[host].take()?;
        self.controllers[controller]
            .downloads
            .retain(|download| download.host != host);
        Some(controller)
    }
}

impl Sim {
    /// The fleet's links (only a fleet run has them).
    fn links(&mut self) -> &mut Links {
        self.links.as_mut().expect("a fleet run")
    }

    fn schedule_link(&mut self, controller: usize, next: Option<(u64, u64)>) {
        if let Some((at, generation)) = next {
            self.queue.schedule(
                at,
                Event::LinkTick {
                    controller,
                    generation,
                },
            );
        }
    }

    /// The tools endpoint of `controller` gets a machine agent's download of `plan` (the
    /// catalogue's binary, checked): admitted under the core's bound, queued, or answered
    /// busy.
    pub(super) fn serve_download(
        &mut self,
        controller: usize,
        host: usize,
        incarnation: u64,
        id: RequestId,
        attempt: u32,
        plan: &StagePlan,
    ) {
        let now = self.queue.now;
        let links = self.links();
        if links.receiving(host, id, attempt) || links.waiting(host, id, attempt) {
            return; // the same request again (a duplicate): already being served
        }
        // The agent left whatever it was receiving or waiting for before: that connection
        // is closed.
        self.cancel_download(host);
        let request = Queued {
            host,
            incarnation,
            id,
            attempt,
            binary: plan.binary.number,
            size_bytes: plan.size_bytes,
            // The tools endpoint tells a fetch ahead by the binary: not the version the
            // agent is told to run.
            ahead: id == super::driver::PRESTAGE,
        };
        let links = self.links();
        let link = &links.controllers[controller];
        // An admitted agent's download waits behind admitted agents' only.
        let ahead_of_it = link
            .queue
            .iter()
            .filter(|queued| request.ahead || !queued.ahead)
            .count() as u32;
        let in_flight = link.slots_taken();
        let transfer = link.transfer;
        match upgrader::admit_agent_download(in_flight, ahead_of_it, links.downloads_max, transfer)
        {
            DownloadAdmission::Busy { retry_after } => {
                self.answer_busy(controller, &request, retry_after.0);
            }
            DownloadAdmission::Queue => {
                links.stats.queued += 1;
                links.queued[host] = Some(controller);
                let link = &mut links.controllers[controller];
                let at = ahead_of_it as usize;
                link.queue.insert(at.min(link.queue.len()), request);
                let held = link.queue.len() as u32;
                links.stats.most_waiting = links.stats.most_waiting.max(held);
                self.queue.schedule(
                    now + upgrader::DOWNLOAD_QUEUE_WAIT.0,
                    Event::QueueTimeout {
                        controller,
                        host,
                        id,
                        attempt,
                    },
                );
                self.fill_slots(controller);
            }
            DownloadAdmission::Admit => self.start_download(controller, request),
        }
    }

    /// The probe endpoint of `controller` gets `host`'s link probe: served at once, outside
    /// the download slots ([`upgrader::LINK_PROBE_BYTES`], sharing the egress with the
    /// downloads), unless the agent is downloading a binary already, which measures its
    /// link as well, or the controller serves [`upgrader::LINK_PROBES_AT_ONCE`] probes
    /// already (busy: the agent probes again at its next try).
    pub(super) fn serve_probe(&mut self, controller: usize, host: usize, incarnation: u64) {
        let now = self.queue.now;
        let jitter = self.links().jitter_per_mille;
        let spread = self.rng.range(1000 - jitter, 1000 + jitter);
        let links = self.links();
        if links.receiving[host].is_some() || links.queued[host].is_some() {
            return;
        }
        let probing = links.controllers[controller]
            .downloads
            .iter()
            .filter(|d| d.probe)
            .count();
        if probing >= upgrader::LINK_PROBES_AT_ONCE as usize {
            // 503: the agent probes again at its next try (`LINK_PROBE_RETRY`).
            links.stats.probes_busy += 1;
            return;
        }
        let cap = (links.agent_link[host] * spread / 1000).max(1);
        let size_bytes = upgrader::LINK_PROBE_BYTES;
        links.settle(controller, now);
        links.controllers[controller].downloads.push(Download {
            host,
            incarnation,
            id: super::driver::LINK_PROBE,
            attempt: 0,
            binary: Version::ZERO,
            cap,
            size_bytes,
            remaining: u128::from(size_bytes) * 1000,
            rate: 1,
            admitted_at: now,
            first_byte_at: now,
            waiting: false,
            probe: true,
        });
        links.receiving[host] = Some(controller);
        let next = links.reshare(controller, now);
        self.schedule_link(controller, next);
    }

    fn answer_busy(&mut self, controller: usize, request: &Queued, retry_after: u64) {
        self.links().stats.busy += 1;
        let message = Message::DownloadBusy {
            host: request.host,
            incarnation: request.incarnation,
            id: request.id,
            attempt: request.attempt,
            retry_after,
        };
        self.send(Party::Host(controller), Party::Host(request.host), message);
    }

    /// Gives `controller`'s free slots to the oldest requests in its queue.
    fn fill_slots(&mut self, controller: usize) {
        loop {
            let links = self.links();
            let link = &mut links.controllers[controller];
            if link.slots_taken() >= links.downloads_max.max(1) {
                return;
            }
            let Some(next) = link.queue.pop_front() else {
                return;
            };
            links.queued[next.host] = None;
            self.start_download(controller, next);
        }
    }

    /// [`Event::QueueTimeout`]: a request still waiting in `controller`'s queue is
    /// answered busy.
    pub(super) fn queue_timeout(
        &mut self,
        controller: usize,
        host: usize,
        id: RequestId,
        attempt: u32,
    ) {
        let links = self.links();
        if links.queued[host] != Some(controller) {
            return;
        }
        let queue = &mut links.controllers[controller].queue;
        let Some(at) = queue
            .iter()
            .position(|q| q.host == host && q.id == id && q.attempt == attempt)
        else {
            return;
        };
        let request = queue.remove(at).expect("found");
        links.queued[host] = None;
        let link = &links.controllers[controller];
        let retry_after =
            upgrader::busy_retry_after(link.queue.len() as u32, links.downloads_max, link.transfer);
        self.answer_busy(controller, &request, retry_after.0);
    }

    /// `controller` starts serving `request`: it takes one of its slots.
    fn start_download(&mut self, controller: usize, request: Queued) {
        let now = self.queue.now;
        let links = self.links();
        let jitter = links.jitter_per_mille;
        self.fleet.first_download_at.get_or_insert(now);
        let spread = self.rng.range(1000 - jitter, 1000 + jitter);
        let links = self.links.as_mut().expect("a fleet run");
        let host = request.host;
        let cap = (links.agent_link[host] * spread / 1000).max(1);
        let binary = request.binary;
        let cached = links.controllers[controller].cached.contains(&binary);
        links.settle(controller, now);
        let link = &mut links.controllers[controller];
        link.downloads.push(Download {
            host,
            incarnation: request.incarnation,
            id: request.id,
            attempt: request.attempt,
            binary,
            cap,
            size_bytes: request.size_bytes.max(1),
            remaining: u128::from(request.size_bytes.max(1)) * 1000,
            rate: 1,
            admitted_at: now,
            first_byte_at: now,
            waiting: !cached,
            probe: false,
        });
        let fetch = !cached && link.fetching.insert(binary);
        let at_once = link.slots_taken();
        links.stats.most_at_once = links.stats.most_at_once.max(at_once);
        links.receiving[host] = Some(controller);
        if fetch {
            links.stats.upstream_fetches += 1;
            let at = now + links.upstream_ms(request.size_bytes);
            self.queue.schedule(
                at,
                Event::UpstreamFetched {
                    controller,
                    version: binary,
                },
            );
        }
        let next = self.links().reshare(controller, now);
        self.schedule_link(controller, next);
    }

    /// [`Event::LinkTick`]: the next download of `controller` may have ended.
    pub(super) fn link_tick(&mut self, controller: usize, generation: u64) {
        let now = self.queue.now;
        let links = self.links();
        if links.controllers[controller].generation != generation {
            return; // reshared since
        }
        links.settle(controller, now);
        let link = &mut links.controllers[controller];
        let (done, going): (Vec<Download>, Vec<Download>) = std::mem::take(&mut link.downloads)
            .into_iter()
            .partition(|d| !d.waiting && d.remaining == 0);
        link.downloads = going;
        let (probes, done): (Vec<Download>, Vec<Download>) =
            done.into_iter().partition(|d| d.probe);
        for probe in &probes {
            // The agent's rate from now on, first byte to last, as it reports it.
            links.receiving[probe.host] = None;
            links.stats.probes += 1;
            let elapsed = now.saturating_sub(probe.first_byte_at).max(1);
            links.measured[probe.host] = Some((probe.size_bytes * 1000 / elapsed).max(1));
        }
        for download in &done {
            links.receiving[download.host] = None;
            links.stats.transfers_ms.push(now - download.admitted_at);
            let held = lockstep_core::Millis(now - download.admitted_at);
            link.transfer = Some(upgrader::transfer_estimate(link.transfer, held));
            // What the agent measures, first byte to last, and reports from then on (the
            // real agent once it runs the binary: by then the rollout has admitted it, so
            // no decision of this rollout reads the difference).
            let bytes = download.size_bytes;
            let elapsed = now.saturating_sub(download.first_byte_at).max(1);
            links.measured[download.host] = Some((bytes * 1000 / elapsed).max(1));
            let last = &mut links.stats.last_downloads;
            last.push((now, download.admitted_at, download.cap));
            if last.len() > LAST_DOWNLOADS_KEPT {
                last.remove(0);
            }
        }
        let next = links.reshare(controller, now);
        self.schedule_link(controller, next);
        self.fill_slots(controller);
        for probe in probes {
            self.report_link_probe(probe.host, probe.incarnation);
        }
        for download in done {
            // The last byte reaches the agent after the link's latency.
            let message = Message::Reply {
                host: download.host,
                incarnation: download.incarnation,
                id: Some(download.id),
                input: Input::Staged {
                    id: download.id,
                    result: Ok(()),
                },
            };
            self.send_stream(Party::Host(controller), Party::Host(download.host), message);
        }
    }

    /// [`Event::UpstreamFetched`]: `controller` has `version` from the stream: the
    /// downloads that waited for it start.
    pub(super) fn upstream_fetched(&mut self, controller: usize, version: Version) {
        let now = self.queue.now;
        let links = self.links();
        links.settle(controller, now);
        let link = &mut links.controllers[controller];
        link.fetching.remove(&version);
        link.cached.insert(version);
        for download in &mut link.downloads {
            if download.binary == version {
                download.waiting = false;
                download.first_byte_at = now;
            }
        }
        let next = links.reshare(controller, now);
        self.schedule_link(controller, next);
    }

    /// A controller staged `version` itself: its cache holds it from now on.
    pub(super) fn binary_cached(&mut self, controller: usize, version: Version) {
        if let Some(links) = &mut self.links {
            links.stats.upstream_fetches += 1;
            links.controllers[controller].cached.insert(version);
        }
    }

    /// `host` closed its download connection (it moved on, or its process died).
    pub(super) fn cancel_download(&mut self, host: usize) {
        let now = self.queue.now;
        let Some(links) = &mut self.links else {
            return;
        };
        links.dequeue_host(host);
        let Some(controller) = links.receiving[host] else {
            return;
        };
        links.settle(controller, now);
        links.remove_host(host);
        let next = links.reshare(controller, now);
        self.schedule_link(controller, next);
        self.fill_slots(controller);
    }

    /// `host` stopped: a machine agent's download is cut; a controller's downloads are
    /// all cut (its agents notice the connection gone and try again).
    pub(super) fn cut_downloads(&mut self, host: usize) {
        let Some(links) = &mut self.links else {
            return;
        };
        if host < links.controllers.len() {
            let link = &mut links.controllers[host];
            link.generation += 1;
            let cut = std::mem::take(&mut link.downloads);
            let waiting = std::mem::take(&mut link.queue);
            links.stats.cut += cut.iter().filter(|d| !d.probe).count() as u64;
            for download in cut {
                links.receiving[download.host] = None;
            }
            for queued in waiting {
                links.queued[queued.host] = None;
            }
        } else if links.receiving[host].is_some() || links.queued[host].is_some() {
            if links.receiving[host].is_some() {
                links.stats.cut += 1;
            }
            self.cancel_download(host);
        }
    }

    /// A machine agent's driver is told busy: it waits the core's backoff and asks the same
    /// controller again, or, busy for [`BUSY_WAIT_MAX_MS`], reports the download failed.
    pub(super) fn download_busy(
        &mut self,
        host: usize,
        incarnation: u64,
        id: RequestId,
        attempt: u32,
        retry_after: u64,
    ) {
        let now = self.queue.now;
        if !self.current(host, incarnation) {
            return;
        }
        let jitter = self.rng.next_u64();
        let Some(awaiting) = self.hosts[host].awaiting.get_mut(&id) else {
            return;
        };
        if awaiting.attempt != attempt {
            return;
        }
        awaiting.busy += 1;
        let since = *awaiting.busy_since.get_or_insert(now);
        if now - since >= BUSY_WAIT_MAX_MS {
            self.hosts[host].awaiting.remove(&id);
            self.links().stats.busy_gave_up += 1;
            let reason = format!(
                "the controller was busy serving other agents for {} s",
                (now - since) / 1000
            );
            self.input(
                host,
                Input::Staged {
                    id,
                    result: Err(reason),
                },
            );
            return;
        }
        let wait = upgrader::busy_download_backoff(
            awaiting.busy,
            Some(lockstep_core::Millis(retry_after)),
            jitter,
        );
        // No answer is awaited meanwhile: the attempt's timeout is void.
        awaiting.attempt += 1;
        self.queue.schedule(
            now + wait.0,
            Event::Resend {
                host,
                incarnation,
                id,
            },
        );
    }
}
