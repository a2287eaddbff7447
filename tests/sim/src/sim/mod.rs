//! The simulator: real `Lifecycle`s, a real `MemoryStore`, and simulated network, disks,
//! streams, clocks, operators and clients, on virtual time in one thread.
//!
//! Every party acts only when an event of the queue reaches it; events are ordered by
//! virtual time, then by the order they were scheduled, and every random draw comes from
//! one generator seeded by the scenario's seed, so a seed replays exactly. A run has two
//! phases: **safety** (faults on; checkers see every observation as it happens) and
//! **liveness** (faults healed, crashed processes restarted, held agents retried by the
//! operator; every agent must be Ready on one version, the model's, at least the one the
//! operator asked for, and every client finished, within the scenario's bound).
//!
//! ## Layout
//!
//! This module is the [`Sim`] that ties the parties together: what a run holds, the run
//! loop, and which party each `Event` and each delivered message reaches. Each party is
//! an `impl Sim` block of its own module, with its state in a struct of its own where the
//! state is its alone:
//!
//! - `queue`: the event queue and virtual time (`EventQueue`), the store's clock, each
//!   host's skewed clock.
//! - `network`: who talks to whom (`Party`), the messages, and how they travel: latency,
//!   loss, duplication, delay, partitions.
//! - `host`: controllers and machine agents: a real `Lifecycle` in a process that boots,
//!   crashes and restarts into another binary; its disk, its host steps, its timers.
//! - `driver`: what each process's driver does with its core's requests: to the store,
//!   the stream or a controller's API, retried with `lockstep_core::client::Call`; the
//!   record watch, the agent-version watch, the machine agents' poll.
//! - `store`: the store executor: requests executed against the real
//!   `lockstep_store::MemoryStore`, and what its log shows the checkers.
//! - `stream`: the agent-binary stream, and the streams adapter's guard
//!   (`HighWaterMark`).
//! - `api`: each controller's API server: agent calls and client calls, through the core's
//!   gate, answered as the facades answer them.
//! - `client`: deployers, watchers and pollers, driven by `lockstep_core::client`.
//! - `operator`: `upgrade-controller`, abort and a second request, and the healing
//!   rounds of the liveness phase.
//! - `outcome`: the checkers fed, the first failure kept, the liveness goal.
//!
//! No import circles: `queue` and `network` are the vocabulary the parties import; besides
//! them only `host` imports others (`driver`, whose request state a host holds, and
//! `stream`, for the binary a host runs), and nothing imports `host`. Parties meet through
//! `Sim`'s methods.

mod api;
mod client;
mod driver;
mod host;
mod links;
mod network;
mod operator;
mod outcome;
mod queue;
mod rollout;
mod store;
mod stream;

use std::collections::BTreeMap;
use std::sync::Arc;

use lockstep_core::client::RetryPolicy;
use lockstep_core::lifecycle::{ControllerId, LeaseToken, Limits, Mutations, RequestId, Snapshot};
use lockstep_core::steps::{Step, StepKey, StepRegistry, Target};
use lockstep_core::{Binary, Version};

use self::client::Client;
use self::host::Host;
use self::links::Links;
pub use self::links::{BUSY_WAIT_MAX_MS, LinkStats};
use self::network::{Message, Network, Party};
use self::outcome::panic_message;
pub use self::outcome::{Failure, FailureKind, FleetReport, Report};
use self::queue::EventQueue;
use self::store::StoreExecutor;
use self::stream::Streams;
use crate::checkers::{self, Checker, Observation};
use crate::rng::Rng;
use crate::scenario::{Scenario, Start, V43, V44};
use crate::trace::{Timeline, Trace};

/// Events a run may take at most: a bound on a run that would never end.
const EVENTS_MAX: u64 = 20_000_000;

/// Options of one run.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    pub mutations: Mutations,
    /// Keep every event's description (for failure reports).
    pub record_trace: bool,
    /// Keep the swimlane's data.
    pub record_timeline: bool,
    /// Checkers (by name) left out of this run: a planted-bug test uses it to show that a
    /// defect is found by another checker too.
    pub without_checkers: &'static [&'static str],
}

/// Something that happens at a moment of virtual time.
#[derive(Clone, Debug)]
enum Event {
    Boot {
        host: usize,
        incarnation: u64,
    },
    Wake {
        host: usize,
        incarnation: u64,
    },
    DiskWrite {
        host: usize,
        incarnation: u64,
        id: RequestId,
        snapshot: Box<Snapshot>,
    },
    HostStep {
        host: usize,
        incarnation: u64,
        id: RequestId,
        key: StepKey,
    },
    Deliver {
        from: Party,
        to: Party,
        message: Box<Message>,
    },
    RequestTimeout {
        host: usize,
        incarnation: u64,
        id: RequestId,
        attempt: u32,
    },
    Resend {
        host: usize,
        incarnation: u64,
        id: RequestId,
    },
    DriverTick {
        host: usize,
        incarnation: u64,
    },
    ClientWake {
        client: usize,
        attempt: u64,
    },
    ClientTimeout {
        client: usize,
        attempt: u64,
    },
    Crash,
    Partition,
    HealPartition {
        index: usize,
    },
    /// A message leaves now (it was held back by its sender until now: a binary coming
    /// over the upstream link).
    Send {
        from: Party,
        to: Party,
        message: Box<Message>,
    },
    /// The next download of a controller may have ended (void if reshared since).
    LinkTick {
        controller: usize,
        generation: u64,
    },
    /// A request has waited in a controller's download queue for as long as it may.
    QueueTimeout {
        controller: usize,
        host: usize,
        id: RequestId,
        attempt: u32,
    },
    /// A controller's upstream fetch of a binary is done.
    UpstreamFetched {
        controller: usize,
        version: Version,
    },
    /// A controller's rollout coordinator makes a pass.
    RolloutPass {
        host: usize,
        incarnation: u64,
    },
    /// The controllers write the agents' status reports they received.
    StatusFlush,
    /// A machine agent's driver hands the desired version to its core, after the core's
    /// start spread (`upgrader::agent_upgrade_delay`).
    FeedVersion {
        host: usize,
        incarnation: u64,
        version: Version,
    },
    /// A machine agent's driver starts fetching a binary ahead of its admission, after the
    /// core's start spread.
    Prestage {
        host: usize,
        incarnation: u64,
    },
    /// A machine agent that knows no rate for its link probes it, or checks that its
    /// last probe measured one (and probes again if not).
    LinkProbe {
        host: usize,
        incarnation: u64,
    },
    /// A machine agent's staging finds the binary on disk already (fetched ahead).
    StagedOnDisk {
        host: usize,
        incarnation: u64,
        id: RequestId,
    },
    Publish,
    OperatorRequest,
    Abort,
    Rerequest,
    /// The lease granted with this token expires (keep-alives lost).
    ExpireLease {
        holder: ControllerId,
        token: LeaseToken,
    },
    /// A controller's report of the binary it runs reaches the store (late: report-lag).
    BinaryReported {
        host: usize,
        incarnation: u64,
        binary: Box<Binary>,
    },
    Heal,
    OperatorTick,
    LivenessCheck,
}

/// One simulation run.
pub struct Sim {
    scenario: Scenario,
    options: RunOptions,
    rng: Rng,
    queue: EventQueue<Event>,
    network: Network,
    executor: StoreExecutor,
    streams: Streams,
    registry: Arc<StepRegistry>,
    hosts: Vec<Host>,
    clients: Vec<Client>,
    /// Operations whose callers were told they succeeded.
    answered_operations: Vec<String>,
    /// See [`Report::answers_before_a_report`].
    answers_before_a_report: u64,
    retry_policy: RetryPolicy,
    /// Faults are over: the liveness phase.
    healed: bool,
    heal_at: u64,
    checkers: Vec<Box<dyn Checker>>,
    events: u64,
    trace: Trace,
    timeline: Option<Timeline>,
    failure: Option<Failure>,
    /// The goal was reached.
    live: bool,
    /// A fleet run's links.
    links: Option<Links>,
    /// A fleet run's report so far.
    fleet: FleetReport,
    /// A fleet run: which hosts have been Ready on the operator's version, and how many.
    upgraded: Vec<bool>,
    upgraded_count: usize,
    /// A fleet run: status reports received by the controllers' API servers and not yet
    /// written (by host: the controller, the phase, the message, the binary).
    pending_statuses: BTreeMap<usize, (usize, lockstep_core::Phase, String, Binary)>,
    status_flush_scheduled: bool,
    /// The agents' statuses (and the store's clock) the last coordinator transaction read.
    rollout_read: Option<(
        Vec<(String, lockstep_store::AgentStatus)>,
        lockstep_core::Timestamp,
    )>,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim")
            .field("seed", &self.scenario.seed)
            .field("now", &self.queue.now)
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

/// The model's bound on agent downloads per controller in a fleet run, as the core reads
/// it.
pub fn agent_downloads_max(fleet: &crate::scenario::Fleet) -> u32 {
    lockstep_core::upgrader::agent_downloads_max(fleet.max_agent_downloads)
}

/// The steps a scenario chose.
pub fn registry_for(chosen: [bool; 4]) -> StepRegistry {
    let all = [
        Step::database("add-machine-roles", V43, "store roles beside legacy jobs"),
        Step::host(
            "rewrite-agent-conf",
            V43,
            &[Target::AllMachines],
            "new agent.conf keys",
        ),
        Step::database("index-event-log", V44, "index the event log by revision"),
        Step::host(
            "move-tools-dir",
            V44,
            &[Target::Controller],
            "tools/ layout",
        ),
    ];
    let steps: Vec<Step> = all
        .into_iter()
        .zip(chosen)
        .filter_map(|(step, keep)| keep.then_some(step))
        .collect();
    StepRegistry::new(&steps).expect("a valid registry")
}

impl Sim {
    pub fn new(scenario: Scenario, options: RunOptions) -> Sim {
        let mut rng = Rng::new(scenario.seed, 0x5EED_0F12);
        let registry = Arc::new(registry_for(scenario.steps));
        let limits = Limits {
            catalogue_check_interval: lockstep_core::Millis(scenario.catalogue_check_ms),
            ..Limits::default()
        };
        let total = usize::from(scenario.controllers) + scenario.agents as usize;
        let hosts: Vec<Host> = (0..total)
            .map(|index| Host::new(&scenario, index, limits, &mut rng))
            .collect();
        // What the machine documents say at the start: every agent reported its binary long
        // ago (an upgrade), or bootstrap recorded the controllers' (a bootstrap; machines
        // report when they first reach a controller).
        let reported = hosts
            .iter()
            .map(|host| {
                (scenario.start == Start::Upgrade || host.is_controller())
                    .then(|| host.config.running.clone())
            })
            .collect();
        let setup = checkers::Setup {
            registry: Arc::clone(&registry),
            policy: scenario.policy.clone(),
            rollout: scenario
                .fleet
                .map_or_else(Default::default, |fleet| fleet.rollout),
            from: scenario.from,
            hosts: hosts
                .iter()
                .map(|host| (host.config.roles, host.is_controller()))
                .collect(),
        };
        let links = scenario.fleet.map(|fleet| {
            Links::new(
                &fleet,
                usize::from(scenario.controllers),
                hosts.len(),
                &mut rng,
            )
        });
        Sim {
            links,
            fleet: FleetReport::default(),
            upgraded: vec![false; hosts.len()],
            upgraded_count: 0,
            pending_statuses: BTreeMap::new(),
            status_flush_scheduled: false,
            rollout_read: None,
            checkers: checkers::all(&setup)
                .into_iter()
                .filter(|checker| !options.without_checkers.contains(&checker.name()))
                .collect(),
            clients: Client::all(&scenario, &mut rng),
            streams: Streams::new(&scenario),
            heal_at: scenario.safety_ms,
            scenario,
            options,
            rng,
            queue: EventQueue::new(),
            network: Network::default(),
            executor: StoreExecutor::new(reported),
            registry,
            hosts,
            answered_operations: Vec::new(),
            answers_before_a_report: 0,
            retry_policy: RetryPolicy::default(),
            healed: false,
            events: 0,
            trace: Trace::new(options.record_trace),
            timeline: options.record_timeline.then(Timeline::default),
            failure: None,
            live: false,
        }
    }

    /// Runs to the end: success, or the first failure.
    pub fn run(mut self) -> Report {
        self.setup();
        let end_at = self.heal_at + self.scenario.liveness_ms;
        while let Some(event) = self.queue.pop() {
            let now = self.queue.now;
            self.executor.clock.set(now);
            if now > end_at {
                self.fail_liveness(
                    "the bound passed before every agent was Ready and every client finished",
                );
                break;
            }
            self.events += 1;
            if self.events > EVENTS_MAX {
                self.fail_liveness("the event budget ran out");
                break;
            }
            self.trace.event(now, &event);
            let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.handle(event);
            }));
            if let Err(panic) = handled {
                let message = panic_message(panic.as_ref());
                self.fail(
                    FailureKind::Crash,
                    "crash",
                    "no process asserts or panics",
                    message,
                );
                break;
            }
            if self.failure.is_some() || self.live {
                break;
            }
        }
        if self.failure.is_none() && !self.live {
            self.fail_liveness("nothing was left to happen before the goal was reached");
        }
        let fleet = self.scenario.fleet.is_some().then(|| {
            let mut fleet = self.fleet.clone();
            if let Some(links) = &self.links {
                fleet.links = links.stats.clone();
            }
            fleet
        });
        Report {
            fleet,
            seed: self.scenario.seed,
            events: self.events,
            simulated_ms: self.queue.now,
            trace_hash: self.trace.hash(),
            answers_before_a_report: self.answers_before_a_report,
            failure: self.failure,
            trace: self.trace.into_lines(),
            timeline: self.timeline,
        }
    }

    fn in_safety(&self) -> bool {
        !self.healed
    }

    /// The world at time 0: the model in the store, every host's first boot, every
    /// client's first call, and the scenario's faults and operator actions.
    fn setup(&mut self) {
        self.executor.create_model(&self.scenario);
        self.scan_store();
        for host in 0..self.hosts.len() {
            if let Some(binary) = self.executor.reported(host).cloned() {
                self.observe(Observation::BinaryReported {
                    host,
                    binary: &binary,
                });
            }
        }
        for host in 0..self.hosts.len() {
            let delay = if self.hosts[host].is_controller() || self.scenario.start == Start::Upgrade
            {
                self.rng.range(0, 2_000)
            } else {
                // Machines are provisioned once bootstrap is under way.
                self.rng.range(10_000, 300_000)
            };
            self.queue.schedule(
                delay,
                Event::Boot {
                    host,
                    incarnation: 0,
                },
            );
        }
        for client in 0..self.clients.len() {
            let delay = match self.clients[client].role {
                client::ClientRole::Deployer { .. } => 0,
                _ => self.rng.range(0, 60_000),
            };
            self.queue
                .schedule(delay, Event::ClientWake { client, attempt: 0 });
        }
        if let Some(interval) = self.scenario.faults.crash_interval_ms {
            let at = self.rng.range(0, interval * 2);
            self.queue.schedule(at, Event::Crash);
        }
        if let Some(interval) = self.scenario.faults.partition_interval_ms {
            let at = self.rng.range(0, interval * 2);
            self.queue.schedule(at, Event::Partition);
        }
        if let Some((_, at)) = self.scenario.newer_patch {
            self.queue.schedule(at, Event::Publish);
        }
        if let Some(request) = self.scenario.request {
            self.queue.schedule(request.at_ms, Event::OperatorRequest);
        }
        if let Some(at) = self.scenario.faults.abort_at_ms {
            self.queue.schedule(at, Event::Abort);
        }
        if let Some(at) = self.scenario.faults.rerequest_at_ms {
            self.queue.schedule(at, Event::Rerequest);
        }
        self.queue.schedule(self.heal_at, Event::Heal);
    }

    /// Hands an event to the party it is for.
    fn handle(&mut self, event: Event) {
        match event {
            Event::Boot { host, incarnation } => self.boot(host, incarnation),
            Event::Wake { host, incarnation } => self.wake(host, incarnation),
            Event::DiskWrite {
                host,
                incarnation,
                id,
                snapshot,
            } => self.disk_write(host, incarnation, id, *snapshot),
            Event::HostStep {
                host,
                incarnation,
                id,
                key,
            } => self.host_step(host, incarnation, id, key),
            Event::Deliver { from, to, message } => {
                if self.network.blocked(from, to) {
                    self.trace.note(self.queue.now, "dropped by a partition");
                    return;
                }
                self.deliver(*message);
            }
            Event::RequestTimeout {
                host,
                incarnation,
                id,
                attempt,
            } => self.request_timeout(host, incarnation, id, attempt),
            Event::Resend {
                host,
                incarnation,
                id,
            } => self.resend(host, incarnation, id),
            Event::DriverTick { host, incarnation } => self.driver_tick(host, incarnation),
            Event::ClientWake { client, attempt } => self.client_wake(client, attempt),
            Event::ClientTimeout { client, attempt } => self.client_timeout(client, attempt),
            Event::Crash => self.crash_fault(),
            Event::Partition => {
                if self.in_safety() {
                    self.partition();
                }
            }
            Event::HealPartition { index } => self.network.heal(index),
            Event::Send { from, to, message } => self.send(from, to, *message),
            Event::LinkTick {
                controller,
                generation,
            } => self.link_tick(controller, generation),
            Event::UpstreamFetched {
                controller,
                version,
            } => self.upstream_fetched(controller, version),
            Event::QueueTimeout {
                controller,
                host,
                id,
                attempt,
            } => self.queue_timeout(controller, host, id, attempt),
            Event::RolloutPass { host, incarnation } => self.rollout_pass(host, incarnation),
            Event::StatusFlush => self.flush_statuses(),
            Event::FeedVersion {
                host,
                incarnation,
                version,
            } => self.feed_version(host, incarnation, version),
            Event::Prestage { host, incarnation } => self.start_prestage(host, incarnation),
            Event::LinkProbe { host, incarnation } => self.link_probe(host, incarnation),
            Event::StagedOnDisk {
                host,
                incarnation,
                id,
            } => {
                if self.current(host, incarnation) {
                    self.input(
                        host,
                        lockstep_core::lifecycle::Input::Staged { id, result: Ok(()) },
                    );
                }
            }
            Event::Publish => self.publish(),
            Event::OperatorRequest => self.operator_request(),
            Event::Abort => self.abort(),
            Event::Rerequest => self.rerequest(),
            Event::ExpireLease { holder, token } => self.expire_lease(holder, token),
            Event::BinaryReported {
                host,
                incarnation,
                binary,
            } => self.record_binary(host, incarnation, &binary),
            Event::Heal => self.heal(),
            Event::OperatorTick => self.operator_tick(),
            Event::LivenessCheck => self.liveness_check(),
        }
    }

    /// Hands a message that arrived to the party it is for.
    fn deliver(&mut self, message: Message) {
        match message {
            Message::StoreRequest {
                host,
                incarnation,
                id,
                request,
            } => self.store_execute(host, incarnation, id, request),
            Message::Reply {
                host,
                incarnation,
                id,
                input,
            } => self.reply(host, incarnation, id, input),
            Message::Refused {
                host,
                incarnation,
                id,
                attempt,
                phase,
                retry_after,
            } => self.refused(host, incarnation, id, attempt, phase, retry_after),
            Message::AgentCall {
                host,
                incarnation,
                controller,
                id,
                attempt,
                call,
            } => self.api_agent_call(host, incarnation, controller, id, attempt, call),
            Message::PollReply {
                host,
                incarnation,
                agent_version,
                stage,
            } => self.poll_reply(host, incarnation, agent_version, stage.map(|plan| *plan)),
            Message::VersionChanged { host, incarnation } => {
                self.version_changed(host, incarnation)
            }
            Message::LinkProbe {
                host,
                incarnation,
                controller,
            } => {
                if self.hosts[controller].process.is_some() {
                    self.serve_probe(controller, host, incarnation);
                }
            }
            Message::DownloadBusy {
                host,
                incarnation,
                id,
                attempt,
                retry_after,
            } => self.download_busy(host, incarnation, id, attempt, retry_after),
            Message::StreamRequest {
                host,
                incarnation,
                id,
                request,
            } => self.stream_serve(host, incarnation, id, request),
            Message::StreamReply {
                host,
                incarnation,
                id,
                reply,
            } => self.stream_reply(host, incarnation, id, reply),
            Message::ClientCall {
                client,
                controller,
                connection,
                attempt,
                op,
            } => self.api_client_call(client, controller, connection, attempt, op),
            Message::ClientReply {
                client,
                attempt,
                server,
                answer,
            } => self.client_reply(client, attempt, server, answer),
        }
    }
}

/// Runs one scenario, catching a panic of the core or the simulator as a crash failure.
pub fn run(scenario: Scenario, options: RunOptions) -> Report {
    let seed = scenario.seed;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Sim::new(scenario, options).run()
    })) {
        Ok(report) => report,
        Err(panic) => {
            let message = panic_message(panic.as_ref());
            Report {
                seed,
                events: 0,
                simulated_ms: 0,
                trace_hash: 0,
                answers_before_a_report: 0,
                fleet: None,
                failure: Some(Failure {
                    kind: FailureKind::Crash,
                    checker: "crash",
                    invariant: "no process asserts or panics",
                    message,
                    at_ms: 0,
                }),
                trace: None,
                timeline: None,
            }
        }
    }
}
